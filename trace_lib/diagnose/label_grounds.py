"""What a run's labels rest on, counted: cut trajectories and unsupported labels.

    g = Grounds(); g.add(result) ...; g.n_cut, g.n_unsupported, g.rates()

Design decisions
- One tally for the in-process runner (`labeling`) and the label job (`label_job`, whose
  shards are counted apart and merged), so `label --json` and a background run report the
  same figures: `n_cut` (trajectories whose prompt left something out), `n_unsupported`
  (lacking/present labels with no verified evidence) and the unsupported rate per
  capability (unsupported / lacking-or-present labels, of labelers that check evidence).
- A label whose labeler does not check evidence (`unsupported` None, the heuristic) is in
  no rate: its capability has no rate rather than a rate of 0.
- No store import: the label job uses it.
"""

from __future__ import annotations

from typing import Any

from trace_lib.diagnose.labelers.protocol import TrajectoryLabels

JUDGED = ("lacking", "present")


class Grounds:
    def __init__(self) -> None:
        self.n_cut = 0
        self.n_unsupported = 0
        self.judged: dict[str, int] = {}  # lacking/present labels of checking labelers
        self.unsupported: dict[str, int] = {}

    def add(self, res: TrajectoryLabels) -> None:
        self.n_cut += int(res.cut)
        for p in res.labels:
            if p.unsupported is None:
                continue
            if p.value in JUDGED:
                self.judged[p.capability] = self.judged.get(p.capability, 0) + 1
            if p.unsupported:
                self.n_unsupported += 1
                self.unsupported[p.capability] = self.unsupported.get(p.capability, 0) + 1

    def rates(self) -> dict[str, float]:
        """Per capability, the unsupported share of its lacking/present labels."""
        return {c: round(self.unsupported.get(c, 0) / n, 4) if n else 0.0
                for c, n in sorted(self.judged.items())}

    def to_json(self) -> dict[str, Any]:
        return {"n_cut": self.n_cut, "n_unsupported": self.n_unsupported,
                "judged": dict(self.judged), "unsupported": dict(self.unsupported)}

    def merge(self, d: dict[str, Any]) -> Grounds:
        """Add another tally's `to_json()` (a shard's) to this one."""
        self.n_cut += int(d.get("n_cut", 0))
        self.n_unsupported += int(d.get("n_unsupported", 0))
        for mine, theirs in ((self.judged, d.get("judged") or {}),
                             (self.unsupported, d.get("unsupported") or {})):
            for cap, n in theirs.items():
                mine[cap] = mine.get(cap, 0) + int(n)
        return self
