"""The sampling engine behind the CPU policy server: continuous batching, KV reuse, LoRA.

Design decisions
- Our own decode loop over a transformers model with a KV cache, not `generate()`: it keeps
  only the sampled token's logprob and the top-k per step (never a vocab-sized tensor per
  step), computes prefill logits for the last position only (`logits_to_keep=1`), and stops
  each row on its own EOS or limit.
- Logprobs are of the distribution the token was sampled from (temperature and top-p
  applied, `cohort.processed_logprobs`), as vLLM reports them with
  `logprobs_mode=processed_logprobs` (how `VLLMConfig` starts it): at any temperature they
  are the behaviour policy's logprobs GRPO needs. Raw logprobs (vLLM's default) differ from
  the policy at temperature != 1, which made the old-policy ratio and the hint weights
  wrong there.
- Continuous batching by cohorts. Requests with the same adapter and sampling settings that
  are waiting together (or arrive within 10 ms of an idle engine) form one cohort, decoded
  as one left-padded batch. The worker advances every live cohort by one unit of work in
  turn (one decode step, or one prefill chunk of at most 256 tokens), so a request asking
  for thousands of tokens slows a short one down by one step per token, never blocks it
  (the old engine ran a batch to its end before looking at the queue). A request leaves
  its cohort as soon as its own rows are done (its rows are cut out of the batch), and a
  cancelled request (the client went away) is cut out at the next step. A cohort that has
  just been prefilled joins a decoding one with the same settings (`cohort.merge`), so
  requests arriving at different times (diverged multi-turn rollouts) still share one
  forward per step.
- Seeded requests batch too: each request keeps its own `torch.Generator` and draws only for
  its own rows (one `multinomial` over its slice), exactly as it would alone, so the same
  seed gives the same tokens whatever else shares the cohort (tested).
- Prefill once per prompt, not once per row: a group (`n=G`, or G identical concurrent
  requests) prefills its prompt as one row and repeats the KV cache to G rows.
- Prefix cache (`kv_cache.PrefixCache`, `kv_cache_bytes`, LRU by bytes): the KV of every prefilled prompt and of
  every finished row (prompt + completion) is kept per adapter, keyed by its token ids; a
  new prompt reuses the entry with the longest common token prefix and prefills only the
  rest. That covers both the system+tools block shared by every seed of an environment and
  a rollout's next turn (its prompt extends the previous prompt + completion). Matching is
  on token ids, so a re-render that differs only costs the differing suffix. Entries of an
  adapter are dropped when it is loaded again or unloaded (their KV came from old weights).
  Reused KV is numerically the same computation split differently: outputs agree with a
  cold prefill to ~1e-6 in logprob (tested at 1e-4 with identical token ids).
- A model with forward hooks may keep per-sequence state between calls (the composed
  MoE's `trajectory` routing is pooled at prefill and held while decoding, per thread), so
  such a model is served exclusively: one cohort at a time, one prompt per cohort, whole
  prefills, no KV reuse; per-token state never leaks between requests.
- LoRA adapters via peft multi-adapter on one frozen base: `load_adapter(name, path)` as
  vLLM's `/v1/load_lora_adapter` (same name again only with `load_inplace`), selection by
  name per step, `disable_adapter()` for the base model. A load/unload of adapter X waits
  until no live cohort uses X and requests behind it wait for it (arrival order), so a
  hot-swap never lands mid-generation.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib.runtime.cohort import (
    MAX_BATCH_ROWS,
    Cohort,
    Job,
    Sample,
    SamplingParams,
    cut_rows,
    merge,
    mergeable,
    processed_logprobs,
    row_kv,
    sample_next,
    samples,
)
from trace_lib.runtime.kv_cache import DEFAULT_KV_CACHE_BYTES, PrefixCache

__all__ = ["MAX_BATCH_ROWS", "EngineError", "PolicyEngine", "Sample", "SamplingParams"]

MAX_LIVE_ROWS = 64  # rows of all live cohorts together; more requests wait their turn
BATCH_WINDOW_S = 0.01  # costs an idle engine at most 10 ms; decoding takes far longer
PREFILL_CHUNK = 256  # tokens of prompt per unit of work: a long prompt cannot stall others


class EngineError(Exception):
    """A request the engine refuses; `status` is the HTTP code the server answers with."""

    def __init__(self, message: str, status: int = 400, type_: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.type = type_


@dataclass
class _AdapterJob:
    action: str  # "load" | "unload"
    name: str
    path: str = ""
    load_inplace: bool = False
    future: Future = field(default_factory=Future)


def _resolve(future: Future, value: Any = None, exc: BaseException | None = None) -> None:
    """Set a future's outcome unless the client cancelled it meanwhile."""
    with contextlib.suppress(InvalidStateError):
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)


class PolicyEngine:
    """Owns a model and its adapters; `submit` samples, `load/unload_adapter` hot-swap."""

    def __init__(self, model: Any, tokenizer: Any, eos_ids: list[int], max_model_len: int,
                 kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES):
        import torch

        self.model = model  # a transformers model; becomes a PeftModel on the first adapter
        self.tokenizer = tokenizer
        self.eos_ids = sorted(set(eos_ids))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
        self.max_model_len = max_model_len
        self.adapters: dict[str, str] = {}  # name -> path
        self.exclusive = bool(getattr(model, "_forward_pre_hooks", None)
                              or getattr(model, "_forward_hooks", None))
        self.prefix_cache = PrefixCache(0 if self.exclusive else kv_cache_bytes)
        self._queue: queue.Queue = queue.Queue()
        # (requests, rows) of the latest cohorts: how well requests batch (tests, the bench).
        self.batch_log: deque[tuple[int, int]] = deque(maxlen=256)
        self.stats = {"decode_steps": 0, "prefill_chunks": 0, "cancelled": 0, "finished": 0,
                      "merges": 0}
        self._running: dict[int, Job] = {}
        self._lock = threading.Lock()
        self._hold = threading.Event()
        self._stop = threading.Event()
        self._rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        self._worker = threading.Thread(target=self._run, name="policy-engine", daemon=True)
        self._worker.start()

    # ---- public API (thread-safe: everything goes through the worker's queue) ----------
    def submit(self, prompt_ids: list[int], n: int, params: SamplingParams,
               adapter: str | None) -> Future:
        """Queue a request; cancel the returned future to abandon it (rows stop at once)."""
        if adapter is not None and adapter not in self.adapters:
            raise EngineError(f"The model `{adapter}` does not exist.", 404, "NotFoundError")
        room = self.max_model_len - len(prompt_ids)
        if room <= 0:
            raise EngineError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {len(prompt_ids)} input tokens.")
        params = SamplingParams(params.temperature, params.top_p,
                                min(params.max_tokens, room), params.top_logprobs, params.seed,
                                params.ignore_eos)
        job = Job(list(prompt_ids), n, params, adapter)
        self._queue.put(job)
        return job.future

    def load_adapter(self, name: str, path: str, load_inplace: bool = False) -> Future:
        job = _AdapterJob("load", name, path, load_inplace)
        self._queue.put(job)
        return job.future

    def unload_adapter(self, name: str) -> Future:
        job = _AdapterJob("unload", name)
        self._queue.put(job)
        return job.future

    def running(self) -> list[dict[str, int]]:
        """The admitted, unfinished requests: prompt length, n, max_tokens, generated."""
        with self._lock:
            jobs = list(self._running.values())
        return [{"id": j.id, "prompt_tokens": len(j.prompt_ids), "n": j.n,
                 "max_tokens": j.params.max_tokens, "generated": j.generated} for j in jobs]

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Admit no new request while inside (live cohorts go on): requests submitted
        meanwhile are admitted together on exit (tests use it to batch on purpose)."""
        self._hold.set()
        try:
            yield
        finally:
            self._hold.clear()

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)
        self._worker.join(timeout=30)

    # ---- worker loop -------------------------------------------------------------------
    def _run(self) -> None:
        cohorts: deque[Cohort] = deque()
        waiting: deque[Any] = deque()
        while not self._stop.is_set():
            if not self._take(waiting, idle=not cohorts):
                break
            self._admit(waiting, cohorts)
            if not cohorts:
                continue
            cohort = cohorts.popleft()
            try:
                alive = self._advance(cohort)
            except Exception as exc:  # the worker must survive a bad request
                self._finish_jobs(cohort, cohort.jobs, exc=exc)
                alive = False
            if alive and cohort.fresh:  # just prefilled: join a decoding cohort if one fits
                cohort.fresh = False
                target = next((c for c in cohorts if mergeable(c, cohort)), None)
                if target is not None:
                    merge(target, cohort)
                    self.stats["merges"] += 1
                    alive = False
            if alive:
                cohorts.append(cohort)
        for cohort in cohorts:
            self._finish_jobs(cohort, cohort.jobs, exc=EngineError("the server is stopping",
                                                                    503, "ServiceUnavailable"))

    def _take(self, waiting: deque, idle: bool) -> bool:
        """Move queued work into `waiting`; an idle engine blocks for the first item and
        then gathers for a short window (G concurrent rollouts arrive a few ms apart)."""
        try:
            if idle:
                first = self._queue.get(timeout=0.05 if waiting else None)
                if first is None:
                    return False
                waiting.append(first)
                deadline = time.monotonic() + BATCH_WINDOW_S
                while (left := deadline - time.monotonic()) > 0:
                    item = self._queue.get(timeout=left)
                    if item is None:
                        return False
                    waiting.append(item)
            while True:
                item = self._queue.get_nowait()
                if item is None:
                    return False
                waiting.append(item)
        except queue.Empty:
            return True

    def _admit(self, waiting: deque, cohorts: deque[Cohort]) -> None:
        """Start cohorts from waiting requests, in arrival order; an adapter change waits
        until no live cohort uses that adapter, and everything behind it waits for it."""
        if self._hold.is_set():
            return
        live = sum(c.rows for c in cohorts)
        while waiting:
            head = waiting[0]
            if isinstance(head, _AdapterJob):
                if any(c.adapter == head.name for c in cohorts):
                    return
                waiting.popleft()
                self._do_adapter(head)
                continue
            if head.future.cancelled():
                waiting.popleft()
                self.stats["cancelled"] += 1
                continue
            if live and (self.exclusive or live + head.n > MAX_LIVE_ROWS):
                return
            batch, rows = [waiting.popleft()], head.n
            for other in list(waiting):
                if isinstance(other, _AdapterJob):
                    break  # nothing jumps an adapter change
                if self.exclusive and other.prompt_ids != head.prompt_ids:
                    continue
                if (other.adapter == head.adapter and not other.future.cancelled()
                        and other.params.batch_key() == head.params.batch_key()
                        and rows + other.n <= MAX_BATCH_ROWS
                        and live + rows + other.n <= max(MAX_LIVE_ROWS, head.n)):
                    waiting.remove(other)
                    batch.append(other)
                    rows += other.n
            if head.adapter is not None and head.adapter not in self.adapters:
                for j in batch:  # unloaded while the request waited
                    _resolve(j.future, exc=EngineError(
                        f"The model `{head.adapter}` does not exist.", 404, "NotFoundError"))
                continue
            self.batch_log.append((len(batch), rows))
            with self._lock:
                for j in batch:
                    self._running[j.id] = j
            cohorts.append(Cohort(batch))
            live += rows

    def _advance(self, cohort: Cohort) -> bool:
        """One unit of work for `cohort`; False once it has nothing left to do."""
        gone = [j for j in cohort.jobs if j.future.cancelled()]
        if gone:
            self.stats["cancelled"] += len(gone)
            self._finish_jobs(cohort, gone, cancelled=True)
            if not cohort.jobs:
                return False
        if not cohort.decoding:
            if len(cohort.prefilled) < len(cohort.unique):
                self._prefill_chunk(cohort)
                self.stats["prefill_chunks"] += 1
            if len(cohort.prefilled) == len(cohort.unique):
                self._start_decoding(cohort)
        else:
            self._decode_step(cohort)
            self.stats["decode_steps"] += 1
        self._finish_done(cohort)
        return bool(cohort.jobs)

    # ---- adapters ------------------------------------------------------------------------
    def _do_adapter(self, job: _AdapterJob) -> None:
        try:
            if job.action == "load":
                self._load(job.name, job.path, job.load_inplace)
                _resolve(job.future, f"Success: LoRA adapter '{job.name}' added successfully.")
            else:
                if job.name not in self.adapters:
                    raise EngineError(f"The lora adapter '{job.name}' cannot be found.", 404,
                                      "NotFoundError")
                self.model.delete_adapter(job.name)
                del self.adapters[job.name]
                self.prefix_cache.drop_adapter(job.name)
                _resolve(job.future,
                         f"Success: LoRA adapter '{job.name}' removed successfully.")
        except Exception as exc:
            _resolve(job.future, exc=exc)

    def _load(self, name: str, path: str, load_inplace: bool) -> None:
        from peft import PeftModel

        if not name or not path:
            raise EngineError("Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.adapters and not load_inplace:
            raise EngineError(
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise EngineError(f"Loading lora {name} failed: No adapter found for {path}", 404,
                              "NotFoundError")
        self.prefix_cache.drop_adapter(name)  # its KV came from the old weights
        try:
            if name in self.adapters:
                self.model.delete_adapter(name)
                del self.adapters[name]
            if not isinstance(self.model, PeftModel):
                self.model = PeftModel.from_pretrained(self.model, str(folder), adapter_name=name)
            else:
                self.model.load_adapter(str(folder), adapter_name=name)
        except Exception as exc:
            raise EngineError(f"Loading lora {name} from {path} failed: {exc}") from exc
        self.model.eval()
        self.adapters[name] = str(folder)

    def _net(self, adapter: str | None) -> tuple[Any, Any]:
        """The module to call and the context to call it in, for `adapter` (None: base)."""
        from peft import PeftModel

        if adapter is not None and adapter not in self.adapters:
            raise EngineError(f"The model `{adapter}` does not exist.", 404, "NotFoundError")
        if not isinstance(self.model, PeftModel):
            return self.model, contextlib.nullcontext()
        if adapter is None and not self.adapters:
            # Every adapter was unloaded (its layers deleted): the wrapped model is the
            # plain base, and peft's disable_adapter() would look for an active one.
            return self.model.base_model.model, contextlib.nullcontext()
        if adapter is None:
            if self.model.active_adapter not in self.adapters:  # the active one went away
                self.model.set_adapter(next(iter(self.adapters)))
            return self.model, self.model.disable_adapter()
        self.model.set_adapter(adapter)
        return self.model, contextlib.nullcontext()

    # ---- prefill ---------------------------------------------------------------------------
    def _prefill_chunk(self, cohort: Cohort) -> None:
        """Prefill at most PREFILL_CHUNK tokens of the cohort's next unprefilled prompt,
        starting from the longest cached prefix."""
        import torch
        from transformers import DynamicCache

        if cohort.current is None:
            prompt = next(p for p in cohort.unique if p not in cohort.prefilled)
            ids = torch.tensor(prompt)
            fed, kv = self.prefix_cache.lookup(cohort.adapter, ids, len(prompt) - 1)
            cache = DynamicCache(ddp_cache_data=kv) if fed else DynamicCache()
            self.prefix_cache.hit_tokens += fed
            self.prefix_cache.miss_tokens += len(prompt) - fed
            cohort.current = (prompt, cache, fed)
        prompt, cache, fed = cohort.current
        end = len(prompt) if self.exclusive else min(len(prompt), fed + PREFILL_CHUNK)
        net, ctx = self._net(cohort.adapter)
        with ctx, torch.inference_mode():
            out = net(input_ids=torch.tensor([prompt[fed:end]]),
                      attention_mask=torch.ones((1, end), dtype=torch.long),
                      position_ids=torch.arange(fed, end)[None],
                      past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        if end < len(prompt):
            cohort.current = (prompt, cache, end)
            return
        kv = _layers(cache)
        self.prefix_cache.put(cohort.adapter, torch.tensor(prompt), kv)
        cohort.prefilled[prompt] = (kv, out.logits[0, -1].float())
        cohort.current = None

    def _start_decoding(self, cohort: Cohort) -> None:
        """Build the batch: each row's prompt KV left-padded to the longest and repeated for
        its n rows (a group prefilled once), then sample every row's first token."""
        import torch
        import torch.nn.functional as F
        from transformers import DynamicCache

        rows_prompt = [tuple(j.prompt_ids) for j in cohort.jobs for _ in range(j.n)]
        width = max(len(p) for p in cohort.unique)
        index = torch.tensor([cohort.unique.index(p) for p in rows_prompt])
        n_layers = len(cohort.prefilled[cohort.unique[0]][0])
        layers = []
        for layer in range(n_layers):
            ks, vs = [], []
            for p in cohort.unique:
                k, v = cohort.prefilled[p][0][layer]
                pad = (0, 0, width - len(p), 0)  # zeros on the left of the sequence axis
                ks.append(F.pad(k, pad))
                vs.append(F.pad(v, pad))
            layers.append((torch.cat(ks)[index], torch.cat(vs)[index]))
        cohort.cache = DynamicCache(ddp_cache_data=layers)
        lens = torch.tensor([len(p) for p in rows_prompt])
        cohort.start = width - lens  # the column where each row's content begins
        cohort.mask = (torch.arange(width)[None, :] >= cohort.start[:, None]).long()
        cohort.pos = lens - 1
        cohort.prompt_lens = lens
        cohort.limit = torch.tensor([j.params.max_tokens for j in cohort.jobs for _ in range(j.n)])
        cohort.stop_on_eos = torch.tensor([not j.params.ignore_eos for j in cohort.jobs
                                           for _ in range(j.n)])
        rows = len(rows_prompt)
        cohort.lengths = torch.zeros(rows, dtype=torch.long)
        cohort.stopped = torch.zeros(rows, dtype=torch.bool)
        cohort.done = torch.zeros(rows, dtype=torch.bool)
        cohort.hist_ids, cohort.hist_lp, cohort.hist_top_v, cohort.hist_top_i = [], [], [], []
        cohort.offset = torch.zeros(rows, dtype=torch.long)  # step of each row's first token
        cohort.top_k = max(j.params.top_logprobs for j in cohort.jobs)
        cohort.gens = {j.id: (self._rng if j.params.seed is None
                              else torch.Generator().manual_seed(j.params.seed))
                       for j in cohort.jobs}
        logits = torch.stack([cohort.prefilled[p][1] for p in cohort.unique])[index]
        cohort.prefilled = {}  # the batch holds the KV now
        cohort.decoding = cohort.fresh = True
        self._record(cohort, logits)

    # ---- decode ----------------------------------------------------------------------------
    def _decode_step(self, cohort: Cohort) -> None:
        import torch

        nxt = torch.where(cohort.done, torch.full_like(cohort.nxt, self.pad_id), cohort.nxt)
        rows = len(nxt)
        cohort.mask = torch.cat([cohort.mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
        cohort.pos = cohort.pos + 1
        net, ctx = self._net(cohort.adapter)
        with ctx, torch.inference_mode():
            out = net(input_ids=nxt[:, None], attention_mask=cohort.mask,
                      position_ids=cohort.pos[:, None], past_key_values=cohort.cache,
                      use_cache=True, logits_to_keep=1)
        cohort.cache = out.past_key_values
        self._record(cohort, out.logits[:, -1, :].float())

    def _record(self, cohort: Cohort, logits: Any) -> None:
        """Sample each row's next token from `logits` and keep what the response needs."""
        import torch

        logp = processed_logprobs(logits, cohort.params)
        draws, k = [], 0
        for j in cohort.jobs:
            draws.append((k, k + j.n, cohort.gens[j.id]))
            k += j.n
        nxt = sample_next(logp, cohort.params, draws)
        cohort.hist_ids.append(nxt)
        cohort.hist_lp.append(logp.gather(1, nxt[:, None])[:, 0])
        if cohort.top_k:
            tops = logp.topk(cohort.top_k, dim=-1)
            cohort.hist_top_v.append(tops.values)
            cohort.hist_top_i.append(tops.indices)
        alive = ~cohort.done  # rows finish once and stay finished: outputs are prefixes
        cohort.lengths += alive.long()
        hit_eos = alive & cohort.stop_on_eos & torch.isin(nxt, torch.tensor(self.eos_ids))
        cohort.stopped |= hit_eos
        cohort.done = cohort.done | hit_eos | (cohort.lengths >= cohort.limit)
        cohort.nxt = nxt
        for j in cohort.jobs:
            j.generated += 1

    def _finish_done(self, cohort: Cohort) -> None:
        if not cohort.decoding:
            return
        done, k = [], 0
        for j in cohort.jobs:
            if bool(cohort.done[k:k + j.n].all()):
                done.append(j)
            k += j.n
        if done:
            self._finish_jobs(cohort, done)

    def _finish_jobs(self, cohort: Cohort, jobs: list[Job], exc: BaseException | None = None,
                     cancelled: bool = False) -> None:
        """Answer `jobs` (samples, an error, or nothing when cancelled) and cut their rows
        out of the cohort's batch."""
        import torch

        keep_rows, k = [], 0
        spans = {}
        for j in cohort.jobs:
            spans[j.id] = (k, k + j.n)
            if j not in jobs:
                keep_rows.extend(range(k, k + j.n))
            k += j.n
        for j in jobs:
            if exc is not None:
                _resolve(j.future, exc=exc)
            elif not cancelled:
                a, b = spans[j.id]
                out = samples(cohort, j, a, b)
                for r, sample in enumerate(out):  # the rollout's next turn extends it
                    kept = row_kv(cohort, a + r, j.prompt_ids, sample.token_ids) \
                        if self.prefix_cache.budget > 0 else None
                    if kept is not None:
                        self.prefix_cache.put(cohort.adapter, torch.tensor(kept[0]), kept[1])
                _resolve(j.future, out)
                self.stats["finished"] += 1
        with self._lock:
            for j in jobs:
                self._running.pop(j.id, None)
        cohort.jobs = [j for j in cohort.jobs if j not in jobs]
        if not cohort.jobs or not cohort.decoding:
            if not cohort.decoding:
                still = {tuple(j.prompt_ids) for j in cohort.jobs}
                cohort.unique = [p for p in cohort.unique if p in still]
                cohort.prefilled = {p: v for p, v in cohort.prefilled.items() if p in still}
                if cohort.current is not None and cohort.current[0] not in still:
                    cohort.current = None
            return
        cut_rows(cohort, keep_rows)

def _layers(cache: Any) -> list[tuple[Any, Any]]:
    """Per-layer (keys, values) of a transformers DynamicCache; other cache kinds (sliding
    windows, recurrent state) cannot be cut and stitched, so they are refused clearly."""
    from transformers.cache_utils import DynamicLayer

    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise EngineError(f"the CPU engine needs a plain KV cache; this model uses {kinds}",
                          500, "InternalServerError")
    return [(layer.keys, layer.values) for layer in cache.layers]
