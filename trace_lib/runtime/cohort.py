"""One decode batch of the policy engine (a cohort) and the row bookkeeping around it.

Design decisions
- A cohort is requests with the same adapter and sampling settings decoded as one
  left-padded batch: a KV cache [rows, heads, width, dim], an attention mask, one position
  per row, and per-step histories of sampled ids, logprobs and top-k (tensors over rows,
  turned into lists once, when a request finishes: no per-token Python work).
- Rows stay grouped by request, in request order, so a request is a contiguous slice:
  its seeded `torch.Generator` draws over exactly its own rows (`sample_next`), whatever
  else shares the batch, and cutting a finished or cancelled request out is one
  `index_select` (`cut_rows`), after which columns that are padding in every row left are
  dropped.
- `merge` is continuous batching: a cohort that has just been prefilled joins a decoding
  one. The narrower cache is padded on the left (masked, so attention never sees it) and
  the shorter history at the front (`offset` is the step of each row's first token), so
  each row keeps its own KV, positions and draws.
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

MAX_BATCH_ROWS = 32  # rows of one cohort


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    top_logprobs: int = 0
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's extension: sample exactly max_tokens tokens

    def batch_key(self) -> tuple:
        return (self.temperature, self.top_p)


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str  # "stop" (EOS sampled) or "length"


_ids = itertools.count(1)


@dataclass
class Job:
    prompt_ids: list[int]
    n: int
    params: SamplingParams
    adapter: str | None
    future: Future = field(default_factory=Future)
    id: int = field(default_factory=lambda: next(_ids))
    generated: int = 0  # tokens sampled so far per row (for status and tests)


ROW_STATE = ("mask", "pos", "start", "prompt_lens", "limit", "stop_on_eos", "lengths",
             "stopped", "done", "nxt", "offset")  # per-row tensors of a decoding cohort
HISTORY = ("hist_ids", "hist_lp", "hist_top_v", "hist_top_i")  # per-step [rows, ...] tensors


class Cohort:
    """Requests decoded as one batch: prefill state first, then per-row decode state."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs
        self.adapter = jobs[0].adapter
        self.params = jobs[0].params
        self.unique: list[tuple[int, ...]] = list(dict.fromkeys(tuple(j.prompt_ids)
                                                                for j in jobs))
        self.prefilled: dict[tuple[int, ...], tuple[list, Any]] = {}  # kv, last logits
        self.current: tuple[tuple[int, ...], Any, int] | None = None  # prompt, cache, fed
        self.decoding = False
        self.fresh = False  # decoding started this step: may merge into another cohort

    @property
    def rows(self) -> int:
        return sum(j.n for j in self.jobs)


def mergeable(a: Cohort, b: Cohort) -> bool:
    """Can `b` (just prefilled) join `a`'s batch?"""
    return (a.decoding and b.decoding and a.adapter == b.adapter
            and a.params.batch_key() == b.params.batch_key() and a.top_k == b.top_k
            and len(a.nxt) + len(b.nxt) <= MAX_BATCH_ROWS)


def merge(a: Cohort, b: Cohort) -> None:
    """Continuous batching: `b`'s rows join `a`'s batch. The shorter cache is padded
    on the left (masked), the shorter history at the front (`offset` says where each
    row's tokens begin), so every row keeps exactly its own KV, positions and draws."""
    import torch
    import torch.nn.functional as F

    width = max(a.mask.shape[1], b.mask.shape[1])
    steps = max(len(a.hist_ids), len(b.hist_ids))
    for c in (a, b):
        pad = width - c.mask.shape[1]
        if pad:
            for layer in c.cache.layers:
                layer.keys = F.pad(layer.keys, (0, 0, pad, 0))
                layer.values = F.pad(layer.values, (0, 0, pad, 0))
            c.mask = F.pad(c.mask, (pad, 0))
            c.start = c.start + pad
        front = steps - len(c.hist_ids)
        if front:
            rows = len(c.nxt)
            c.hist_ids = [torch.zeros(rows, dtype=torch.long)] * front + c.hist_ids
            c.hist_lp = [torch.zeros(rows)] * front + c.hist_lp
            if c.top_k:
                c.hist_top_v = [torch.zeros(rows, c.top_k)] * front + c.hist_top_v
                c.hist_top_i = [torch.zeros(rows, c.top_k, dtype=torch.long)] * front \
                    + c.hist_top_i
            c.offset = c.offset + front
    for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
        la.keys = torch.cat([la.keys, lb.keys])
        la.values = torch.cat([la.values, lb.values])
    for name in ROW_STATE:
        setattr(a, name, torch.cat([getattr(a, name), getattr(b, name)]))
    for name in HISTORY:
        setattr(a, name, [torch.cat([x, y]) for x, y in zip(getattr(a, name),
                                                            getattr(b, name), strict=True)])
    a.jobs = a.jobs + b.jobs
    a.gens.update(b.gens)


def cut_rows(cohort: Cohort, keep_rows: list[int]) -> None:
    """Keep only `keep_rows` of a decoding cohort (the rest finished or were cancelled)."""
    import torch

    keep = torch.tensor(keep_rows)
    cohort.cache.batch_select_indices(keep)
    for name in ROW_STATE:
        setattr(cohort, name, getattr(cohort, name)[keep])
    for name in HISTORY:
        setattr(cohort, name, [h[keep] for h in getattr(cohort, name)])
    trim = int(cohort.start.min())  # columns that are padding in every remaining row
    if trim:
        for layer in cohort.cache.layers:
            layer.keys = layer.keys[:, :, trim:]
            layer.values = layer.values[:, :, trim:]
        cohort.mask = cohort.mask[:, trim:]
        cohort.start = cohort.start - trim


def samples(cohort: Cohort, job: Job, a: int, b: int) -> list[Sample]:
    """The finished request `job` (rows a..b) as Samples."""
    import torch

    ids = torch.stack(cohort.hist_ids, 1)[a:b]
    lps = torch.stack(cohort.hist_lp, 1)[a:b].tolist()
    top_v = torch.stack(cohort.hist_top_v, 1)[a:b].tolist() if cohort.top_k else None
    top_i = torch.stack(cohort.hist_top_i, 1)[a:b].tolist() if cohort.top_k else None
    k = job.params.top_logprobs
    out = []
    for r in range(b - a):
        n = int(cohort.lengths[a + r])
        o = int(cohort.offset[a + r])
        tops = ([list(zip(top_i[r][t][:k], top_v[r][t][:k], strict=True))
                 for t in range(o, o + n)] if k else [])
        out.append(Sample(ids[r, o:o + n].tolist(), lps[r][o:o + n], tops,
                          "stop" if bool(cohort.stopped[a + r]) else "length"))
    return out


def row_kv(cohort: Cohort, row: int, prompt: list[int],
           tokens: list[int]) -> tuple[list[int], list[tuple[Any, Any]]] | None:
    """(ids, per-layer KV copies) of a finished row: its prompt and every sampled token
    but the last, which was never fed. None when there is nothing worth keeping."""
    if len(tokens) < 2:
        return None
    start = int(cohort.start[row])
    end = start + len(prompt) + len(tokens) - 1
    if end > cohort.cache.layers[0].keys.shape[2]:
        return None
    kv = [(layer.keys[row:row + 1, :, start:end].clone(),
           layer.values[row:row + 1, :, start:end].clone()) for layer in cohort.cache.layers]
    return prompt + tokens[:-1], kv


def processed_logprobs(logits: Any, params: SamplingParams) -> Any:
    """Log-probabilities of the distribution a row is sampled from: `logits / temperature`,
    tokens outside the top-p nucleus at -inf, renormalised (vLLM's
    `logprobs_mode=processed_logprobs`, which the trainer starts vLLM with). These are
    what GRPO needs as the behaviour policy's log-probs at any temperature; greedy rows
    (temperature 0) get the raw log-softmax, as in vLLM."""
    import torch

    if params.temperature <= 0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / params.temperature
    if params.top_p < 1.0:
        sorted_p, order = torch.softmax(scaled, dim=-1).sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always the first token)
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p
        scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(1, order, drop),
                                    float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample_next(logp: Any, params: SamplingParams, draws: list[tuple[int, int, Any]]) -> Any:
    """Next token per row from `processed_logprobs`; `draws` = (start, stop, generator) per
    request in the batch."""
    import torch

    if params.temperature <= 0:
        return logp.argmax(dim=-1)
    probs = logp.exp()
    if len(draws) == 1:
        return torch.multinomial(probs, 1, generator=draws[0][2])[:, 0]
    # Row slices of a contiguous tensor: each request's draw sees exactly its own rows.
    return torch.cat([torch.multinomial(probs[a:b], 1, generator=gen)[:, 0]
                      for a, b, gen in draws])
