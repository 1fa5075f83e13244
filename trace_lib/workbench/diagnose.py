"""Diagnose use cases: capabilities, labeling runs, label edits and undo, rank and export.

Design decisions
- The Labels page, the Rankings page, the `capabilities`/`label`/`labels`/`rank` verbs and
  the diagnose notebook call these functions; the stage modules (`trace_lib.diagnose.*`)
  do the work. Where a use case is exactly one stage call it is re-exported under its
  use-case name, so there is still one function per action to call (and to patch).
- `rankings` is the Rankings page's whole read in one short connection (ranking, greedy
  cover, failure clusters, the export document), so the page holds no SQL.
- `label` takes the labeler's settings as keywords; LLM-only settings are dropped for the
  offline heuristic labeler (what both front ends did by hand before).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.data_model import LABEL_VALUES  # noqa: F401  (the grid's value menu)
from trace_lib.diagnose import charts  # noqa: F401  (pure plotly figures for the pages)
from trace_lib.diagnose.capabilities import (  # noqa: F401  (use cases as they are)
    CORE,
    add_capability,
    list_capabilities,
    set_status,
    update_capability,
)
from trace_lib.diagnose.labels import (  # noqa: F401  (use cases as they are)
    LabelFilter,
    bulk_edit,
    edit_history,
    edit_labels,
    export_labels,
    grid_changes,
    import_labels,
    label_grid,
    label_runs,
    left_out_note,
    left_out_runs,
    review_queue,
    transcript_with_evidence,
)
from trace_lib.diagnose.ranking import RankConfig, Ranking, ranking_json  # noqa: F401

Db = str | Path | None
LLM_LABELERS = ("anthropic", "openai")
LABELERS = ("heuristic", *LLM_LABELERS)


# --------------------------------------------------------------------------- labeling


def label(db: Db, labeler: str | None = "heuristic", *, runs: int = 1,
          capabilities: list[str] | None = None, run_prefix: str | None = None,
          progress: Callable[[int, int], None] | None = None, model: str | None = None,
          base_url: str | None = None, concurrency: int | None = None,
          temperature: float | None = None, batch: bool = False,
          resume: str | None = None) -> list[Any]:
    """Run `runs` independent labeling runs (`label`, the Labels page's Run button), or
    complete the partial run `resume` (its own labeler unless `labeler` names it)."""
    from trace_lib.diagnose.labeling import run_labeling

    cfg: dict[str, Any] = {}
    if labeler in LLM_LABELERS or (resume is not None and labeler is None):
        cfg = {"model": model, "base_url": base_url}
        if concurrency is not None:
            cfg["concurrency"] = concurrency
        if temperature is not None:
            cfg["temperature"] = temperature
        if labeler == "anthropic" and batch:
            cfg["batch"] = True
    return run_labeling(db, labeler, runs=runs, capabilities=capabilities,
                        run_prefix=run_prefix, progress=progress, resume=resume, **cfg)


def edit_label(db: Db, trajectory_id: str, capability: str, value: str, *, editor: str,
               note: str | None = None) -> int:
    """One person's decision on one (trajectory, capability) pair: an appended edit row."""
    from trace_lib.diagnose.labels import edit_label as _edit

    return _edit(db, trajectory_id, capability, value, editor=editor, note=note)


def undo_edit(db: Db, *, editor: str, edit_id: int | None = None,
              trajectory_id: str | None = None, capability: str | None = None) -> int:
    """Undo an edit (by id, or the latest one on a pair): itself an appended row."""
    from trace_lib.diagnose.labels import undo_edit as _undo

    return _undo(db, editor=editor, edit_id=edit_id, trajectory_id=trajectory_id,
                 capability=capability)


def evaluate_labels(db: Db, runs: list[str] | None = None) -> dict[str, Any]:
    """Labels vs planted deficits (demo) and the benchmark's reward breakdown."""
    from trace_lib.diagnose.evaluation import evaluate

    return evaluate(db, runs=runs)


def propose_capabilities(db: Db, provider: str = "anthropic", *, model: str | None = None,
                         base_url: str | None = None, max_pairs: int = 8) -> list[Any]:
    """Ask an LLM for new capabilities from contrastive pairs; they land as `proposed`."""
    from trace_lib.diagnose.capabilities import propose_capabilities as _propose
    from trace_lib.llm import get_provider

    llm = get_provider(provider, model=model, base_url=base_url)
    return _propose(db, llm, max_pairs=max_pairs)


# ---------------------------------------------------------------------------- ranking


def run_ids(db: Db) -> list[str]:
    """Label runs, oldest first ([] without a database)."""
    if not store.resolve_db_path(db).exists():
        return []
    with store.connect(db) as con:
        return [r[0] for r in con.execute(
            "SELECT id FROM label_runs ORDER BY started_at, id").fetchall()]


def rank(db: Db, cfg: RankConfig | None = None) -> Ranking:
    """Cov / Delta per run and the K-of-N selection alone (a notebook cell)."""
    from trace_lib.diagnose.ranking import rank as _rank

    return _rank(db, cfg)


def write_selected(path: str | Path, document: list[dict[str, Any]]) -> Path:
    """Write a selected_capabilities.json document (the one `rankings` built)."""
    import json

    path = Path(path)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


@dataclass
class RankingsView:
    ranking: Ranking
    kept: list[str]
    cover: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    document: list[dict[str, Any]] = field(default_factory=list)


def rankings(db: Db, cfg: RankConfig, details: bool = True) -> RankingsView:
    """Rank and select (`rank`, the Rankings page) in one read: the ranking, the
    selected_capabilities.json document that `rank --export` writes and the page's export
    button offers and, with `details`, the greedy cover of the kept set and the failure
    clusters the page draws."""
    from trace_lib.diagnose.ranking import (
        failure_clusters,
        greedy_cover,
        rank_con,
        selected_document,
    )

    with store.connect(db) as con:
        ranking = rank_con(con, cfg)
        kept = [r.capability for r in ranking.selected]
        cover = greedy_cover(con, kept) if kept and details else []
        clusters = failure_clusters(con, [r.capability for r in ranking.rows
                                          if r.status != "rejected"]) if details else []
        doc = selected_document(con, cfg)
    return RankingsView(ranking, kept, cover, clusters, doc)
