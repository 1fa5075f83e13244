"""Scope: which trajectories a diagnose action works on (datasets, agent models, domains).

Design decisions
- One small frozen dataclass that every front end builds the same way (the CLI's
  repeatable `--dataset NAME`, `--agent-model`, `--domain`; the scope picker on the Labels
  and Rankings pages; a notebook cell) and that label, rank, export and the review queue
  take unchanged. Empty tuples mean "no restriction", so `Scope()` is the whole store.
- It lives below the stages (beside the data model), not in the workbench, because the
  stage functions that turn it into SQL need it and a stage may not import a use case;
  `trace_lib.workbench.diagnose.Scope` is the same class.
- Datasets are named by the name a person gave them (what the Trajectories page shows),
  or by store id; a name matches every dataset of that name. An unknown name is a clear
  error that lists the known names, never an empty ranking that looks like a result.
- `where` returns SQL over `trajectories {alias}` plus parameters, so a caller composes it
  into its own query (one round trip, no id lists pulled into Python).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from trace_lib.errors import UserInputError


@dataclass(frozen=True)
class Scope:
    """The trajectories an action covers. Empty tuples mean "no restriction"."""

    datasets: tuple[str, ...] = ()  # dataset names (or store ids)
    agent_models: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Widgets and argparse give lists (or None); keep the scope hashable (a cache key).
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                object.__setattr__(self, f.name, ())
            elif isinstance(value, str):
                object.__setattr__(self, f.name, (value,))
            else:
                object.__setattr__(self, f.name, tuple(sorted({str(v) for v in value})))

    def is_empty(self) -> bool:
        return not (self.datasets or self.agent_models or self.domains)

    def describe(self) -> str:
        """One line for notes and captions: 'all trajectories' or what is chosen."""
        if self.is_empty():
            return "all trajectories"
        parts = []
        if self.datasets:
            parts.append("dataset " + ", ".join(self.datasets))
        if self.agent_models:
            parts.append("agent " + ", ".join(self.agent_models))
        if self.domains:
            parts.append("domain " + ", ".join(self.domains))
        return "; ".join(parts)

    def dataset_ids(self, con: Any) -> list[str]:
        """The store ids the dataset names (or ids) stand for; unknown names are an error."""
        rows = con.execute("SELECT id, name FROM datasets").fetchall()
        out: list[str] = []
        unknown = []
        for want in self.datasets:
            ids = [i for i, n in rows if want in (i, n)]
            if not ids:
                unknown.append(want)
            out += ids
        if unknown:
            names = sorted({n for _, n in rows})
            raise UserInputError(f"--dataset: unknown dataset(s) {', '.join(unknown)}; known: "
                                 f"{', '.join(names) or '(none imported yet)'}")
        return sorted(set(out))

    def where(self, con: Any, alias: str = "t") -> tuple[str, list[Any]]:
        """(SQL boolean over `trajectories {alias}`, parameters); 'TRUE' for no scope."""
        clauses, params = ["TRUE"], []
        if self.datasets:
            clauses.append(f"list_contains(?::VARCHAR[], {alias}.dataset_id)")
            params.append(self.dataset_ids(con))
        if self.agent_models:
            clauses.append(f"list_contains(?::VARCHAR[], {alias}.agent_model)")
            params.append(list(self.agent_models))
        if self.domains:
            clauses.append(f"list_contains(?::VARCHAR[], {alias}.domain)")
            params.append(list(self.domains))
        return " AND ".join(clauses), params


def scope_options(con: Any) -> dict[str, list[str]]:
    """What a scope picker offers: dataset names, agent models and domains in the store."""
    def col(sql: str) -> list[str]:
        return [r[0] for r in con.execute(sql).fetchall() if r[0] is not None]

    return {
        "datasets": col("SELECT DISTINCT name FROM datasets ORDER BY 1"),
        "agent_models": col("SELECT DISTINCT agent_model FROM trajectories ORDER BY 1"),
        "domains": col("SELECT DISTINCT domain FROM trajectories ORDER BY 1"),
    }
