"""The sampling engine behind the CPU policy server: batched decoding with LoRA selection.

Design decisions
- Our own decode loop over a transformers model with a KV cache, not `generate()`: it keeps
  only the sampled token's logprob and the top-k per step (never a vocab-sized tensor per
  step, which for SmolLM2 is 49k floats x steps x rows), computes prefill logits for the
  last position only (`logits_to_keep=1`), and stops each row on its own EOS or limit.
- Logprobs are the model's raw distribution (log-softmax of the logits before temperature
  and top-p), as vLLM reports them by default (`logprobs_mode=raw_logprobs`): at
  temperature 1 they are exactly the behaviour policy's logprobs GRPO needs.
- Dynamic batching: one worker thread owns the model; requests queue up and the worker
  decodes together every request with the same adapter and sampling settings that is
  waiting or arrives within 10 ms (left-padded, positions from the attention mask), so G
  concurrent rollouts cost about one decode instead of G. Seeded requests batch too: each
  request keeps its own `torch.Generator` and draws only for its own rows (one
  `multinomial` over its slice), exactly as it would alone, so the same seed gives the same
  tokens whatever else shares the batch (tested; a batch-shape float difference in the
  logits could in principle flip a draw that sits on a boundary, never seen in practice).
  Unseeded requests draw from the engine's shared generator.
- LoRA adapters via peft multi-adapter on one frozen base: `load_adapter(name, path)` as
  vLLM's `/v1/load_lora_adapter` (same name again only with `load_inplace`), selection by
  name per batch, `disable_adapter()` for the base model. Adapters change only between
  batches (the worker does both), so a hot-swap never lands mid-generation.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_BATCH_ROWS = 32
BATCH_WINDOW_S = 0.01  # costs at most 10 ms of latency per batch; decoding takes far longer


class EngineError(Exception):
    """A request the engine refuses; `status` is the HTTP code the server answers with."""

    def __init__(self, message: str, status: int = 400, type_: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.type = type_


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    top_logprobs: int = 0
    seed: int | None = None

    def batch_key(self) -> tuple:
        return (self.temperature, self.top_p)


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str  # "stop" (EOS sampled) or "length"


@dataclass
class _Job:
    prompt_ids: list[int]
    n: int
    params: SamplingParams
    adapter: str | None
    future: Future = field(default_factory=Future)


@dataclass
class _AdapterJob:
    action: str  # "load" | "unload"
    name: str
    path: str = ""
    load_inplace: bool = False
    future: Future = field(default_factory=Future)


class PolicyEngine:
    """Owns a model and its adapters; `submit` samples, `load/unload_adapter` hot-swap."""

    def __init__(self, model: Any, tokenizer: Any, eos_ids: list[int], max_model_len: int):
        import torch

        self.model = model  # a transformers model; becomes a PeftModel on the first adapter
        self.tokenizer = tokenizer
        self.eos_ids = sorted(set(eos_ids))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
        self.max_model_len = max_model_len
        self.adapters: dict[str, str] = {}  # name -> path
        self._queue: queue.Queue = queue.Queue()
        # (requests, rows) of the latest decodes: how well requests batch (tests, the bench).
        self.batch_log: deque[tuple[int, int]] = deque(maxlen=256)
        self._stop = threading.Event()
        self._rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        self._worker = threading.Thread(target=self._run, name="policy-engine", daemon=True)
        self._worker.start()

    # ---- public API (thread-safe: everything goes through the worker's queue) ----------
    def submit(self, prompt_ids: list[int], n: int, params: SamplingParams,
               adapter: str | None) -> Future:
        if adapter is not None and adapter not in self.adapters:
            raise EngineError(f"The model `{adapter}` does not exist.", 404, "NotFoundError")
        room = self.max_model_len - len(prompt_ids)
        if room <= 0:
            raise EngineError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {len(prompt_ids)} input tokens.")
        params = SamplingParams(params.temperature, params.top_p,
                                min(params.max_tokens, room), params.top_logprobs, params.seed)
        job = _Job(list(prompt_ids), n, params, adapter)
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

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)
        self._worker.join(timeout=30)

    # ---- worker ------------------------------------------------------------------------
    def _run(self) -> None:
        pending: list[Any] = []
        while not self._stop.is_set():
            job = pending.pop(0) if pending else self._queue.get()
            if job is None:
                break
            if isinstance(job, _AdapterJob):
                self._do_adapter(job)
                continue
            batch = [job]
            rows = job.n
            # Gather compatible requests arriving within a short window: G concurrent
            # rollouts reach the server a few ms apart (HTTP + template rendering). Queued
            # jobs that do not fit go first next time, so nothing starves.
            deadline = time.monotonic() + BATCH_WINDOW_S
            while rows < MAX_BATCH_ROWS:
                if pending:
                    break  # an incompatible job is already waiting: keep arrival order
                try:
                    other = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if (other is not None and isinstance(other, _Job)
                        and other.adapter == job.adapter
                        and other.params.batch_key() == job.params.batch_key()
                        and rows + other.n <= MAX_BATCH_ROWS):
                    batch.append(other)
                    rows += other.n
                else:
                    pending.append(other)
                    break  # keep order: an adapter swap waits for this batch only
            self.batch_log.append((len(batch), rows))
            try:
                results = self._generate(batch)
            except Exception as exc:  # the worker must survive a bad request
                for j in batch:
                    j.future.set_exception(exc)
                continue
            for j, res in zip(batch, results, strict=True):
                j.future.set_result(res)

    def _do_adapter(self, job: _AdapterJob) -> None:
        try:
            if job.action == "load":
                self._load(job.name, job.path, job.load_inplace)
                job.future.set_result(f"Success: LoRA adapter '{job.name}' added successfully.")
            else:
                if job.name not in self.adapters:
                    raise EngineError(f"The lora adapter '{job.name}' cannot be found.", 404,
                                      "NotFoundError")
                self.model.delete_adapter(job.name)
                del self.adapters[job.name]
                job.future.set_result(
                    f"Success: LoRA adapter '{job.name}' removed successfully.")
        except Exception as exc:
            job.future.set_exception(exc)

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

    def _generate(self, batch: list[_Job]) -> list[list[Sample]]:
        import contextlib

        import torch
        from peft import PeftModel

        params = batch[0].params
        prompts = [j.prompt_ids for j in batch for _ in range(j.n)]
        limits = [j.params.max_tokens for j in batch for _ in range(j.n)]
        top_k = max(j.params.top_logprobs for j in batch)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token is at the end
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        # One generator per request: a seeded request draws from its own, in the same order
        # and over the same rows as if it ran alone; unseeded ones share the engine's.
        draws: list[tuple[int, int, Any]] = []
        k = 0
        for j in batch:
            gen = (self._rng if j.params.seed is None
                   else torch.Generator().manual_seed(j.params.seed))
            draws.append((k, k + j.n, gen))
            k += j.n

        adapter = batch[0].adapter
        if adapter is not None and adapter not in self.adapters:  # unloaded while queued
            raise EngineError(f"The model `{adapter}` does not exist.", 404, "NotFoundError")
        net = self.model
        if isinstance(self.model, PeftModel):
            if adapter is None and not self.adapters:
                # Every adapter was unloaded (its layers deleted): the wrapped model is the
                # plain base, and peft's disable_adapter() would look for an active one.
                net = self.model.base_model.model  # get_base_model() also wants one
                ctx = contextlib.nullcontext()
            elif adapter is None:
                if self.model.active_adapter not in self.adapters:  # the active one went away
                    self.model.set_adapter(next(iter(self.adapters)))
                ctx = self.model.disable_adapter()
            else:
                self.model.set_adapter(adapter)
                ctx = contextlib.nullcontext()
        else:
            ctx = contextlib.nullcontext()

        rows = len(prompts)
        limit_t = torch.tensor(limits)
        eos_t = torch.tensor(self.eos_ids)
        lengths = torch.zeros(rows, dtype=torch.long)
        stopped = torch.zeros(rows, dtype=torch.bool)
        done = torch.zeros(rows, dtype=torch.bool)
        # Per-step tensors, turned into lists once at the end (no per-token Python work).
        hist_ids, hist_lp, hist_top_v, hist_top_i = [], [], [], []
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = None
        step_ids, step_pos = ids, positions
        with ctx, torch.inference_mode():
            for _ in range(max(limits)):
                out = net(input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                                 past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache = out.past_key_values
                logits = out.logits[:, -1, :].float()
                logp = torch.log_softmax(logits, dim=-1)
                nxt = self._sample(logits, params, draws)
                hist_ids.append(nxt)
                hist_lp.append(logp.gather(1, nxt[:, None])[:, 0])
                if top_k:
                    tops = logp.topk(top_k, dim=-1)
                    hist_top_v.append(tops.values)
                    hist_top_i.append(tops.indices)
                alive = ~done  # rows finish once and stay finished: outputs are prefixes
                lengths += alive.long()
                hit_eos = alive & torch.isin(nxt, eos_t)
                stopped |= hit_eos
                done = done | hit_eos | (lengths >= limit_t)
                if bool(done.all()):
                    break
                nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
                step_ids = nxt[:, None]
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype)], dim=1)
        all_ids = torch.stack(hist_ids, 1).tolist()
        all_lp = torch.stack(hist_lp, 1).tolist()
        top_v = torch.stack(hist_top_v, 1).tolist() if top_k else None
        top_i = torch.stack(hist_top_i, 1).tolist() if top_k else None
        samples = []
        for i in range(rows):
            n = int(lengths[i])
            tops = ([list(zip(top_i[i][t], top_v[i][t], strict=True)) for t in range(n)]
                    if top_k else [])
            samples.append(Sample(all_ids[i][:n], all_lp[i][:n], tops,
                                  "stop" if bool(stopped[i]) else "length"))
        result, k = [], 0
        for j in batch:
            result.append(samples[k:k + j.n])
            k += j.n
        return result

    @staticmethod
    def _sample(logits: Any, params: SamplingParams, draws: list[tuple[int, int, Any]]) -> Any:
        """Next token per row; `draws` = (start, stop, generator) per request in the batch."""
        import torch

        if params.temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            # keep the smallest prefix whose mass reaches top_p (always the first token)
            drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(1, order, sorted_p)
        if len(draws) == 1:
            return torch.multinomial(probs, 1, generator=draws[0][2])[:, 0]
        # Row slices of a contiguous tensor: each request's draw sees exactly its own rows.
        return torch.cat([torch.multinomial(probs[a:b], 1, generator=gen)[:, 0]
                          for a, b, gen in draws])
