"""The policy engine's prefix cache: KV of token sequences, reused by longest common prefix.

Design decisions
- Keyed by token ids, not by text or message structure: a new prompt reuses the entry with
  the longest common token prefix, whatever made them equal (the system+tools block every
  seed of an environment shares, or a rollout's previous prompt + completion on its next
  turn). A re-render that differs from the sampled ids costs only the differing suffix.
- Per adapter (None = base): KV depends on the weights. The engine drops an adapter's
  entries when that adapter is loaded again or unloaded.
- LRU by bytes, with entries that a new one extends dropped on insert (the longer one
  serves every lookup the shorter one would), and nothing under MIN_PREFIX tokens kept.
- Entries hold [1, heads, len, dim] tensors that nothing mutates in place (transformers'
  DynamicCache concatenates into new tensors), so a lookup hands out views, not copies.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MIN_PREFIX = 8  # shorter shared prefixes are not worth a cache copy
DEFAULT_KV_CACHE_BYTES = 1 << 30


@dataclass
class _Entry:
    adapter: str | None
    ids: Any  # 1-D LongTensor: the tokens whose KV `kv` holds
    kv: list[tuple[Any, Any]]  # per layer (keys, values), each [1, heads, len, dim]
    nbytes: int


class PrefixCache:
    """KV of token sequences per adapter, LRU by bytes; lookup by longest common prefix."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.nbytes = 0
        self._keys = itertools.count()
        self.hit_tokens = 0  # prompt tokens not prefilled thanks to the cache
        self.miss_tokens = 0  # prompt tokens prefilled

    @staticmethod
    def _common(a: Any, b: Any) -> int:
        import torch

        n = min(len(a), len(b))
        if n == 0:
            return 0
        diff = torch.nonzero(a[:n] != b[:n])
        return n if len(diff) == 0 else int(diff[0, 0])

    def lookup(self, adapter: str | None, ids: Any, limit: int) -> tuple[int, list]:
        """(length, kv cut to it) of the longest reusable prefix of `ids`, at most `limit`."""
        best, best_key = 0, None
        for key, entry in self.entries.items():
            if entry.adapter != adapter:
                continue
            n = min(self._common(entry.ids, ids), limit)
            if n > best:
                best, best_key = n, key
        if best_key is None or best < MIN_PREFIX:
            return 0, []
        entry = self.entries[best_key]
        self.entries.move_to_end(best_key)
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in entry.kv]

    def put(self, adapter: str | None, ids: Any, kv: list[tuple[Any, Any]]) -> None:
        if self.budget <= 0 or len(ids) < MIN_PREFIX:
            return
        nbytes = sum(k.numel() * k.element_size() * 2 for k, _ in kv)
        if nbytes > self.budget:
            return
        for key, entry in list(self.entries.items()):
            if entry.adapter != adapter:
                continue
            common = self._common(entry.ids, ids)
            if common == len(ids):  # already covered by a longer (or equal) entry
                self.entries.move_to_end(key)
                return
            if common == len(entry.ids):  # the new one covers it
                self._drop(key)
        self.entries[next(self._keys)] = _Entry(adapter, ids, kv, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.budget:
            self._drop(next(iter(self.entries)))

    def drop_adapter(self, adapter: str) -> None:
        for key in [k for k, e in self.entries.items() if e.adapter == adapter]:
            self._drop(key)

    def _drop(self, key: int) -> None:
        self.nbytes -= self.entries.pop(key).nbytes
