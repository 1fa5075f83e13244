"""Diagnose use cases: capabilities, labeling runs, label edits and undo, rank and export.

Design decisions
- The Labels page, the Rankings page, the `capabilities`/`label`/`labels`/`rank` verbs and
  the diagnose notebook call these functions; the stage modules (`trace_lib.diagnose.*`)
  do the work. Where a use case is exactly one stage call it is re-exported under its
  use-case name, so there is still one function per action to call (and to patch).
- `rankings` is the Rankings page's whole read in one short connection (ranking, greedy
  cover, failure clusters, the export document), so the page holds no SQL. It ranks once
  and reads the (materialised) lacking labels once; cover and export reuse them.
- `Scope` (datasets, agent models, domains) is threaded through label, rank, export and
  the review queue; `scope_options` is what a picker offers, and `pick_scope` is the one
  picker the Labels and Rankings pages draw (the page hands it its widget function:
  nothing under trace_lib imports streamlit).
- `version` is the key a page caches its one query result under: it changes with every
  label run, edit, undo and capability change (and only then), so a cached result is
  never stale and a slider move on an unchanged store recomputes nothing it need not.
- The Rankings page's expensive parts (bootstrap stability's B resamples over every
  trajectory, the failure clusters, and the cover signatures and examples the kept set's
  cover and export document come from) are computed when a label run finishes and stored
  (`diagnose.rank_precompute`, issue 35); `rankings` reads them. `rankings_state` tells the page, in the same connection
  as the version, whether it is missing for the current labels (after an edit, an undo, a
  capability change, or for other inputs); then the page calls `prepare_rankings` with
  a progress bar before it ranks, rather than block in a plain spinner.
- `label` takes the labeler's settings as keywords; LLM-only settings are dropped for the
  offline heuristic labeler (what both front ends did by hand before). `max_context` and
  `tokenizer` size an LLM labeler's prompts when the server does not say (issue 31).
- The grid carries what its labels rest on (`cut_messages`, `cut_tokens`, `unsupported`
  after the capability columns: read-only, `GRID_GROUNDS`).
- `evidence_transcript` is the Labels page's transcript: the viewer's (the Trajectories
  page's renderer, system prompt folded, per-turn tokens and cost) with every run's
  evidence for the pair by message, so the page opens it at the evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.data_model import LABEL_VALUES  # noqa: F401  (the grid's value menu)
from trace_lib.diagnose import (
    materialise,
    ranking_charts,  # noqa: F401  (pure plotly figures for the pages)
)
from trace_lib.diagnose.agreement import (  # noqa: F401  (agreement, stability)
    ORDERS,
    AgreementReport,
    StabilityConfig,
    StabilityInfo,
)
from trace_lib.diagnose.capability_curation import (  # noqa: F401  (use cases as they are)
    CORE,
    add_capability,
    list_capabilities,
    set_status,
    update_capability,
)
from trace_lib.diagnose.label_csv import (  # noqa: F401  (use cases as they are)
    export_labels,
    import_labels,
    labels_csv,
)
from trace_lib.diagnose.label_runs import (  # noqa: F401  (use cases as they are)
    label_runs,
    left_out_note,
    left_out_runs,
)
from trace_lib.diagnose.labels import (  # noqa: F401  (use cases as they are)
    GRID_GROUNDS,
    LabelFilter,
    bulk_edit,
    describe_edit,
    describe_grid_save,
    edit_history,
    edit_labels,
    evidence_by_message,
    grid_changes,
    label_grid,
    review_queue,
    transcript_with_evidence,
)
from trace_lib.diagnose.ranking import (  # noqa: F401
    NONE_LACKING,
    UNLABELLED,
    RankConfig,
    Ranking,
    format_p,
    ranking_json,
)
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store import labels as store_labels

Db = str | Path | None
LLM_LABELERS = ("anthropic", "openai")
LABELERS = ("heuristic", *LLM_LABELERS)


# --------------------------------------------------------------------------- labeling


def label(db: Db, labeler: str | None = "heuristic", *, runs: int = 1,
          capabilities: list[str] | None = None, run_prefix: str | None = None,
          progress: Callable[[int, int], None] | None = None, model: str | None = None,
          base_url: str | None = None, concurrency: int | None = None,
          temperature: float | None = None, batch: bool = False,
          resume: str | None = None, scope: Scope | None = None,
          max_context: int | None = None, tokenizer: str | None = None,
          fence_key: str | None = None) -> list[Any]:
    """Run `runs` independent labeling runs (`label`, the Labels page's Run button) over
    the trajectories in `scope`, or complete the partial run `resume` (its own labeler
    unless `labeler` names it). An LLM labeler cuts each transcript to its model's context
    (`max_context` when the server does not report one) and checks its evidence."""
    from trace_lib.diagnose.labeling import run_labeling

    cfg = labeler_settings(labeler, model, base_url, concurrency, temperature, batch,
                           llm=labeler in LLM_LABELERS or (resume is not None and labeler is None),
                           max_context=max_context, tokenizer=tokenizer, fence_key=fence_key)
    return run_labeling(db, labeler, runs=runs, capabilities=capabilities,
                        run_prefix=run_prefix, progress=progress, resume=resume,
                        scope=scope, **cfg)


def labeler_settings(labeler: str | None, model: str | None, base_url: str | None,
                     concurrency: int | None, temperature: float | None, batch: bool, *,
                     llm: bool, max_context: int | None = None,
                     tokenizer: str | None = None, fence_key: str | None = None
                     ) -> dict[str, Any]:
    """The labeler's settings; LLM-only ones are dropped for the heuristic labeler."""
    cfg: dict[str, Any] = {}
    if llm:
        if max_context is not None and max_context < 1:
            raise UserInputError(f"--max-context {max_context}: expected a positive number "
                                 "of tokens")
        cfg = {"model": model, "base_url": base_url, "max_context": max_context,
               "tokenizer": tokenizer, "fence_key": fence_key}
        if concurrency is not None:
            cfg["concurrency"] = concurrency
        if temperature is not None:
            cfg["temperature"] = temperature
        if labeler == "anthropic" and batch:
            cfg["batch"] = True
    return cfg


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
    from trace_lib.diagnose.label_quality import evaluate

    return evaluate(db, runs=runs)


def propose_capabilities(db: Db, provider: str = "anthropic", *, model: str | None = None,
                         base_url: str | None = None, max_pairs: int = 8) -> list[Any]:
    """Ask an LLM for new capabilities from contrastive pairs; they land as `proposed`."""
    from trace_lib.diagnose.capability_curation import propose_capabilities as _propose
    from trace_lib.llm import get_provider

    llm = get_provider(provider, model=model, base_url=base_url)
    return _propose(db, llm, max_pairs=max_pairs)


# ---------------------------------------------------------------------------- ranking


def run_ids(db: Db) -> list[str]:
    """Label runs, oldest first ([] without a database)."""
    if not store.resolve_db_path(db).exists():
        return []
    with store.connect(db) as con:
        return store_labels.run_ids(con)


def scope_options(db: Db) -> dict[str, list[str]]:
    """What a scope picker offers: dataset names, agent models, domains (empty without a
    database)."""
    from trace_lib.scope import scope_options as _options

    if not store.resolve_db_path(db).exists():
        return {"datasets": [], "agent_models": [], "domains": []}
    with store.connect(db) as con:
        return _options(con)


def version(db: Db) -> tuple[Any, ...]:
    """The store version the diagnose pages key their cached results on (brings the
    materialised labels up to date first)."""
    from trace_lib.diagnose import materialise

    with store.connect(db) as con:
        return materialise.version(con)


def rank(db: Db, cfg: RankConfig | None = None, *, scope: Scope | None = None) -> Ranking:
    """Cov / Delta per run and the K-of-N selection alone (a notebook cell)."""
    from trace_lib.diagnose.ranking import rank as _rank

    return _rank(db, cfg, scope=scope)


def write_selected(path: str | Path, document: list[dict[str, Any]]) -> Path:
    """Write a selected_capabilities.json document (the one `rankings` built)."""
    import json

    path = Path(path)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


@dataclass
class EvidenceTranscript:
    transcript: Any  # transcript_model.Transcript, with the viewer's extras
    evidence: list[dict[str, Any]]  # every run's label and evidence for the pair
    at: dict[int, list[str]]  # message idx -> the evidence notes pointing at it

    @property
    def first(self) -> int | None:
        """The first message the evidence points at (where the page opens)."""
        return min(self.at, default=None)


def evidence_transcript(db: Db, trajectory_id: str, capability: str) -> EvidenceTranscript:
    """One trajectory as the transcript viewer draws it, with every run's evidence for
    (trajectory, capability) and the messages that evidence points at (the Labels page)."""
    from trace_lib.diagnose.labels import evidence
    from trace_lib.explore.transcript_loading import load_transcript

    with store.connect(db, read_only=True) as con:
        t = load_transcript(con, trajectory_id)
    ev = evidence(db, t.id, capability)
    return EvidenceTranscript(t, ev, evidence_by_message(ev))


@dataclass
class RankingsView:
    ranking: Ranking
    kept: list[str]
    cover: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    document: list[dict[str, Any]] = field(default_factory=list)
    stability: StabilityInfo | None = None  # None: the plain run ranking
    # Where the stability's threshold-free part came from: stored | memory | computed |
    # chosen (`StableRanking.source`); None for the plain run ranking.
    stability_source: str | None = None
    clusters_source: str | None = None  # stored | computed (None: no details asked)
    # Where the cover's signatures and the export examples came from: stored | computed
    # (None: no details asked).
    kept_source: str | None = None


@dataclass
class RankingsState:
    version: tuple[Any, ...]  # `version`: what the page keys its result on
    pending: bool  # threshold-free parts to compute first (`prepare_rankings`)


def rankings_state(db: Db, runs: list[str] | None, stability: StabilityConfig | None,
                   scope: Scope | None = None) -> RankingsState:
    """The store version and whether a Rankings view with these inputs would first compute
    its threshold-free parts (bootstrap resamples, failure clusters: nothing stored for
    the current labels): one connection, every rerun."""
    from trace_lib.diagnose.rank_precompute import pending

    with store.connect(db) as con:
        v = materialise.version(con)
        return RankingsState(v, pending(con, runs, stability, scope, version=v))


def prepare_rankings(db: Db, runs: list[str] | None, stability: StabilityConfig | None,
                     scope: Scope | None = None,
                     progress: Callable[[float, str], None] | None = None) -> dict[str, str]:
    """Compute and store a Rankings view's threshold-free parts for these inputs (what a
    label run's finish stores for the defaults), reporting `progress(fraction, text)`;
    returns where each came from (`stored` if it already was)."""
    from trace_lib.diagnose.rank_precompute import prepare

    with store.connect(db) as con:
        return prepare(con, runs, stability, scope, progress)


def rankings(db: Db, cfg: RankConfig, details: bool = True, *,
             scope: Scope | None = None,
             stability: StabilityConfig | None = None) -> RankingsView:
    """Rank and select (`rank`, the Rankings page) in one read over `scope`: the ranking,
    the selected_capabilities.json document that `rank --export` writes and the page's
    export button offers and, with `details`, the greedy cover of the kept set and the
    failure clusters the page draws. Ranks once; the effective labels are read once.
    `stability` ranks K-of-N over runs or bootstrap resamples (`diagnose.agreement`)."""
    from trace_lib.diagnose.agreement import stable_ranking
    from trace_lib.diagnose.rank_precompute import kept_details, stored_failure_clusters
    from trace_lib.diagnose.ranking import rank_con, selected_document
    from trace_lib.diagnose.stability import counted_run_ids

    info, source, clusters_source, kept_source = None, None, None, None
    with store.connect(db) as con:
        if stability is None:
            ranking = rank_con(con, cfg, scope=scope)
            run_ids = counted_run_ids(con, cfg.runs)
        else:
            sr = stable_ranking(con, cfg, stability, scope=scope)
            ranking, info, source, run_ids = sr.ranking, sr.info, sr.source, sr.run_ids
        kept = [r.capability for r in ranking.selected]
        cover, clusters, examples = [], [], None
        if details:
            shown = [r.capability for r in ranking.rows if r.status != "rejected"]
            # Threshold-free: stored at the label run's finish (or on first use) for the
            # current labels, so neither a first visit nor a slider move recomputes them:
            # the clusters, and the signatures any kept set's cover and examples come from.
            clusters, clusters_source = stored_failure_clusters(con, run_ids, scope, shown)
            got = kept_details(con, kept, scope, shown)
            cover, examples, kept_source = got.cover, got.examples, got.source
        doc = selected_document(con, cfg, ranking=ranking, examples=examples)
    return RankingsView(ranking, kept, cover, clusters, doc, info, source, clusters_source,
                        kept_source)


# -------------------------------------------------------------- agreement, review queue


def agreement(db: Db, runs: list[str] | None = None, *,
              scope: Scope | None = None) -> AgreementReport:
    """Fleiss' kappa across runs per capability and Cohen's kappa of labelers and people
    (`agreement`, the Labels page's Agreement section)."""
    from trace_lib.diagnose.agreement import agreement_con

    with store.connect(db) as con:
        return agreement_con(con, runs, scope=scope)


def review_queue_ranked(db: Db, cfg: RankConfig | None = None,
                        stability: StabilityConfig | None = None, *, limit: int = 50,
                        order: str = "disagreement", scope: Scope | None = None) -> Any:
    """The review queue ordered by disagreement or by ranking sensitivity (`review-queue`,
    the Labels page's Review queue tab)."""
    from trace_lib.diagnose.agreement import review_queue_con

    with store.connect(db) as con:
        return review_queue_con(con, cfg, stability, limit=limit, order=order, scope=scope)


# -------------------------------------------------------------------- the scope picker

# One row per `Scope` field: (field, widget label, widget key, help). The keys are the same
# on every page, so a scope chosen on the Labels page is still chosen on the Rankings page.
SCOPE_PICKER: tuple[tuple[str, str, str, str | None], ...] = (
    ("datasets", "Datasets", "scope_datasets", "none chosen: every dataset"),
    ("agent_models", "Agent models", "scope_agents", None),
    ("domains", "Domains", "scope_domains", None),
)


def pick_scope(multiselect: Callable[..., list[str]], options: dict[str, list[str]]) -> Scope:
    """The scope a person picks: one `multiselect(label, choices, key=, help=)` widget per
    `Scope` field over `options` (what `scope_options` returns). A page passes
    `st.multiselect`, drawn wherever it calls this (its sidebar)."""
    return Scope(**{name: multiselect(label, options[name], key=key, help=help_)
                    for name, label, key, help_ in SCOPE_PICKER})
