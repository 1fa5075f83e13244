"""`KeyRuns`: a set of 64-bit keys, each with a 64-bit value, in sorted numpy runs.

What an import must remember of every record it has seen (is this content stored already?
did this source id come with other content before?) grows with the file. Kept as Python
dicts and sets that is ~100 bytes per record (1 GiB at 10M); kept in the store's keys it
was DuckDB's in-memory index of the open transaction (the 10M import ran out of its
768 MiB there, bench/README session 24). Here it is 16 bytes per record.

Design decisions
- Sorted runs, merged like a binary counter (a log-structured merge): `add` appends the
  batch as a sorted run and merges the last two runs while the newer is at least as large
  as the older, so there are at most ~log2(n / batch) runs and each key is re-sorted
  O(log n) times: an import's whole cost is O(n log n), never a sort of everything per
  batch.
- A lookup is one `searchsorted` per run. Keys are unique across runs by contract (the
  caller adds only keys it did not find), so the first run holding a key answers.
- Values are compared by the caller: a key found with another value is the interesting
  case (a stored id with other content; a source id with other content).
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64


class KeyRuns:
    """64-bit keys with a 64-bit value each; `add` unique keys, `get` many at once."""

    def __init__(self, keys: np.ndarray | None = None, values: np.ndarray | None = None):
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        if keys is not None and len(keys):
            self.add(keys, values if values is not None else np.zeros(len(keys), U64))

    def __len__(self) -> int:
        return sum(len(k) for k, _ in self._runs)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._runs)

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Add keys not already here (the caller's `get` said so), with their values."""
        if not len(keys):
            return
        order = np.argsort(keys, kind="stable")
        self._runs.append((np.asarray(keys, U64)[order], np.asarray(values, U64)[order]))
        while len(self._runs) > 1 and len(self._runs[-1][0]) >= len(self._runs[-2][0]):
            (k2, v2), (k1, v1) = self._runs.pop(), self._runs.pop()
            k, v = np.concatenate([k1, k2]), np.concatenate([v1, v2])
            order = np.argsort(k, kind="stable")
            self._runs.append((k[order], v[order]))

    def get(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found, value) per key: `found` a bool array, `value` 0 where not found."""
        keys = np.asarray(keys, U64)
        found = np.zeros(len(keys), bool)
        values = np.zeros(len(keys), U64)
        for run_keys, run_values in self._runs:
            at = np.searchsorted(run_keys, keys)
            inside = at < len(run_keys)
            hit = np.zeros(len(keys), bool)
            hit[inside] = run_keys[at[inside]] == keys[inside]
            hit &= ~found
            values[hit] = run_values[at[hit]]
            found |= hit
        return found, values


def sha_halves(shas: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The first and second 64 bits of hex SHA-256 digests: the first is a trajectory's id
    (`t_` + these 16 hex digits), the pair its content's identity here."""
    hi = np.fromiter((int(s[:16], 16) for s in shas), U64, len(shas))
    lo = np.fromiter((int(s[16:32], 16) for s in shas), U64, len(shas))
    return hi, lo


def as_u64(values: list[int]) -> np.ndarray:
    """Python ints (`hash()`: signed 64-bit) as unsigned 64-bit keys."""
    return np.fromiter((v & 0xFFFF_FFFF_FFFF_FFFF for v in values), U64, len(values))
