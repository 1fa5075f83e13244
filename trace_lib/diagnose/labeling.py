"""Labeling runs: N independent runs of a labeler over the store, written as label runs.

Design decisions
- One run = one `label_runs` row + one `labels` row per (trajectory, capability); N runs
  get seeds 0..N-1 (and, for LLM labelers, a sampling temperature) so they are
  independent samples, as the K-of-N selection assumes.
- A run says what it is: `status` is 'running' from its first row, 'finished' only once
  every trajectory was written, 'failed' (with `status_reason`) when the labeler could
  not work. Rank, the review queue and exports read finished runs only, so a run killed
  with SIGKILL (still 'running') or a failed one never counts; `label --resume RUN`
  labels the trajectories a partial run lacks (and retries its failed pairs), with the
  run's own labeler, capabilities and seed.
- Fail fast, fail loud: before the first call the labeler's `preflight()` (if it has one)
  checks that its server accepts connections; a connection refused mid-run stops the run
  at once (`LabelerUnavailable`); when the first `FAIL_FAST_AFTER` trajectories all
  failed, or every pair of the run failed, the run is marked failed and `LabelRunFailed`
  (exit status 1 in the CLI) says why, once.
- Transcripts are read once with one short connection. Results are written as Arrow
  batches (column arrays, no DataFrame) in chunks; a crash loses at most one chunk (a
  trajectory's pairs are written together). A fast in-process labeler (`fast = True`,
  the heuristic: hundreds of trajectories/s) writes over ONE held connection (given up
  every `HOLD_S` seconds so other processes can read): opening a connection per chunk
  and going through pandas was 68% of its time (issue 15). An LLM labeler labels with no connection open
  (calls take minutes), in a thread pool of `labeler.concurrency`, and writes each chunk
  with a short connection, so the app can read meanwhile.
- A run that finishes is added to the materialised labels (`materialise.sync`) on the
  same connection, so the first rank after a labeling run reads counts, not 14M labels,
  and the Rankings page's default view's threshold-free parts (bootstrap stability's
  counts over every trajectory, the failure clusters) are computed and stored
  (`rank_precompute.store_default`, issue 35), so its first visit reads them too.
- `scope` (datasets, agent models, domains) picks the trajectories to label.
- A failed pair is stored with `value NULL` and the reason in `error`, never as `na`;
  the run's tokens and cost go into `label_runs.cost`.
- What the labels rest on is part of the run's report: every label row carries how much
  its prompt cut (`cut_messages`, `cut_tokens`) and whether it is unsupported (evidence
  checked, issue 31); the summary counts the cut trajectories (`n_cut`), the unsupported
  labels and their rate per capability; the labeler's `notes` (its context and what
  counted tokens) go into `label_runs.notes`.
- An LLM labeler's fence key (`label_prompt`) is part of the run's params, as its seed
  is: `--resume` fences the remaining requests with it, and a run given the same key,
  seed and capabilities sends byte-identical prompts.
- Progress is a callback (done, total): the CLI wraps it in tqdm, the app in st.progress.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.data_model import Capability
from trace_lib.diagnose import rank_precompute
from trace_lib.diagnose.capability_curation import capabilities_on, ensure_builtin
from trace_lib.diagnose.label_grounds import Grounds
from trace_lib.diagnose.label_runs import create_run, writer_tag
from trace_lib.diagnose.labelers import (
    Labeler,
    LabelerUnavailable,
    TrajectoryLabels,
    get_labeler,
)
from trace_lib.errors import UserInputError
from trace_lib.llm import Usage
from trace_lib.scope import Scope
from trace_lib.store import labels as store_labels
from trace_lib.store import trajectories as store_trajectories
from trace_lib.store.labels import LABEL_COLUMNS
from trace_lib.trajectories import load_transcripts

Progress = Callable[[int, int], None]
WRITE_CHUNK = 200
# A held connection is given up this often (and reopened at the next write), so another
# process (the app, a CLI read) waiting on DuckDB's file lock gets in well within
# `store.connect`'s 10 s retry window.
HOLD_S = 2.0


@dataclass
class RunSummary:
    run_id: str
    labeler: str
    n_trajectories: int
    n_labels: int
    n_failed: int
    cost: dict[str, Any]
    n_cut: int = 0  # trajectories whose prompt left something out
    n_unsupported: int = 0  # lacking/present labels without verified evidence
    # per capability: unsupported share of its lacking/present labels (labelers that check)
    unsupported_rate: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _select(db: str | Path | None, capabilities: list[str] | None,
            trajectory_ids: list[str] | None, scope: Scope | None = None
            ) -> tuple[list[Capability], list[str]]:
    # A name given twice is labelled once: `labels` has no key to refuse a second row of
    # the same pair (store migration LABELS_UNKEYED), so its writers never make one.
    capabilities = list(dict.fromkeys(capabilities)) if capabilities else capabilities
    trajectory_ids = list(dict.fromkeys(trajectory_ids)) if trajectory_ids is not None \
        else None
    with store.connect(db) as con:
        ensure_builtin(con)
        catalog = {c.name: c for c in capabilities_on(con)}
        if capabilities:
            unknown = [c for c in capabilities if c not in catalog]
            if unknown:
                raise UserInputError(f"--capabilities: unknown {', '.join(unknown)}; known: "
                                     f"{', '.join(sorted(catalog))}")
            caps = [catalog[c] for c in capabilities]
        else:
            caps = [c for c in catalog.values() if c.status == "accepted"]
        if not caps:
            raise UserInputError("no capabilities to label: accept some first")
        if trajectory_ids is None:
            trajectory_ids = store_trajectories.ids_in_scope(con, scope or Scope())
        if not trajectory_ids:
            if scope is not None and not scope.is_empty():
                raise UserInputError(f"no trajectories in scope ({scope.describe()})")
            raise UserInputError("no trajectories in the store: import some first")
    return caps, trajectory_ids


def label_batch(run_id: str, results: list[TrajectoryLabels]) -> Any:
    """One Arrow table of label rows (column arrays built directly, no DataFrame)."""
    import pyarrow as pa

    arrow_types = {"confidence": pa.float64(), "cut_messages": pa.int32(),
                    "cut_tokens": pa.int32(), "evidence_dropped": pa.int32(),
                    "unsupported": pa.bool_()}
    cols: dict[str, list[Any]] = {c: [] for c in LABEL_COLUMNS}
    for r in results:
        for p in r.labels:
            cols["run_id"].append(run_id)
            cols["trajectory_id"].append(r.trajectory_id)
            cols["capability"].append(p.capability)
            cols["value"].append(p.value)
            # Most pairs (`na` without grounds) have no evidence: skip the encoder for them.
            cols["evidence"].append("[]" if p.evidence == [] else json.dumps(p.evidence))
            cols["confidence"].append(p.confidence)
            cols["error"].append(p.error)
            cols["cut_messages"].append(r.cut_messages)
            cols["cut_tokens"].append(r.cut_tokens)
            cols["evidence_dropped"].append(p.evidence_dropped)
            cols["unsupported"].append(p.unsupported)
    return pa.table({c: pa.array(v, arrow_types.get(c, pa.string()))
                     for c, v in cols.items()})


def insert_batch(con: Any, batch: Any) -> None:
    """Append an Arrow table of label rows on an open connection, in one transaction."""
    with store.transaction(con):
        store_labels.insert_labels(con, batch)


class _Sink:
    """Where a run's rows and status go: one held connection (fast labelers) or a short
    connection per write (LLM labelers, so the app can read between chunks)."""

    def __init__(self, db: str | Path | None, hold: bool) -> None:
        self.db = db
        self.hold = hold
        self.con: Any = None
        self.opened = 0.0

    @contextlib.contextmanager
    def _con(self) -> Iterator[Any]:
        if not self.hold:
            with store.connect(self.db) as con:
                yield con
            return
        if self.con is None:
            self.con = store.open_connection(self.db)
            self.opened = time.monotonic()
        yield self.con
        if time.monotonic() - self.opened > HOLD_S:
            self.close()

    def write(self, run_id: str, results: list[TrajectoryLabels]) -> None:
        if results:
            batch = label_batch(run_id, results)
            with self._con() as con:
                insert_batch(con, batch)

    def status(self, run_id: str, status: str, reason: str | None = None,
               cost: dict[str, Any] | None = None, notes: list[str] | None = None) -> None:
        with self._con() as con:
            store_labels.set_run_status(con, run_id, status, reason, cost, notes)
            if status == "finished":
                rank_precompute.run_finished(con)  # the Rankings page's first visit reads it

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None


class LabelRunFailed(UserInputError):
    """A label run that produced no usable labels; it is marked failed in the store."""

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"label run {run_id} failed: {reason} (the run is marked failed and "
                         f"is not counted; fix the cause, then `label --resume {run_id}`)")
        self.run_id = run_id
        self.reason = reason


# Stop after this many trajectories in a row failed on every pair (auth, model name, a
# server that answers garbage): the remaining calls would fail the same way.
FAIL_FAST_AFTER = 8


def set_run_status(db: str | Path | None, run_id: str, status: str,
                   reason: str | None = None, cost: dict[str, Any] | None = None) -> None:
    """Record how a run ended; a finished run joins the materialised labels at once."""
    with store.connect(db) as con:
        store_labels.set_run_status(con, run_id, status, reason, cost)
        if status == "finished":
            rank_precompute.run_finished(con)


def _resume_plan(db: str | Path | None, run_id: str) -> dict[str, Any]:
    """What a partial run still needs: its row, capabilities, and unlabeled trajectories."""
    with store.connect(db) as con:
        row = store_labels.run_head(con, run_id)
        if row is None:
            known = store_labels.unfinished_run_ids(con)
            raise UserInputError(f"label --resume {run_id}: no such label run; unfinished runs: "
                                 f"{', '.join(known) or '(none)'}")
        labeler, model, params, status = row
        if status == "finished":
            raise UserInputError(f"label --resume {run_id}: the run is already finished")
        params = json.loads(params) if isinstance(params, str) else (params or {})
        caps = params.get("capabilities") or None
        wanted = params.get("trajectory_ids")
        if wanted is None:
            wanted = store_trajectories.all_ids(con)
        done = store_labels.complete_trajectories(con, run_id)
        # Trajectories with a failed pair are labeled again: drop their rows first.
        store_labels.delete_failed_trajectories(con, run_id)
    return {"labeler": labeler, "model": model, "params": params, "capabilities": caps,
            "todo": [t for t in wanted if t not in done], "n_done": len(done)}


def run_labeling(
    db: str | Path | None = None,
    labeler: str | Labeler | None = None,
    *,
    runs: int = 1,
    capabilities: list[str] | None = None,
    trajectory_ids: list[str] | None = None,
    run_prefix: str | None = None,
    progress: Progress | None = None,
    resume: str | None = None,
    scope: Scope | None = None,
    **labeler_cfg: Any,
) -> list[RunSummary]:
    """Label the store `runs` times; returns one summary per run.

    `resume=RUN` completes a partial (running or failed) run instead: the trajectories it
    has no labels for, and those with a failed pair, with the run's labeler, capabilities
    and seed. Raises LabelRunFailed (the run marked failed) when the labeler cannot work.
    `scope` labels only its trajectories (and the run records them, for `--resume`)."""
    if resume is not None:
        return [_resume(db, resume, labeler, progress, labeler_cfg)]
    if runs < 1:
        raise UserInputError(f"--runs {runs}: expected at least 1")
    labeler = "heuristic" if labeler is None else labeler
    lab = get_labeler(labeler, **labeler_cfg) if isinstance(labeler, str) else labeler
    caps, tids = _select(db, capabilities, trajectory_ids, scope)
    scoped = scope is not None and not scope.is_empty()
    with store.connect(db) as con:
        transcripts = load_transcripts(con, tids)
    prefix = run_prefix or f"{lab.name}-{uuid.uuid4().hex[:6]}"
    total = runs * len(transcripts)
    summaries = []
    for r in range(runs):
        run_id = prefix if runs == 1 else f"{prefix}-r{r}"
        params: dict[str, Any] = {"seed": r, "run_index": r, "n_runs": runs,
                                  "capabilities": [c.name for c in caps],
                                  "n_trajectories": len(transcripts), **fence_setting(lab)}
        if trajectory_ids is not None or scoped:
            params["trajectory_ids"] = list(tids)  # what --resume has to complete
        if scoped:
            params["scope"] = {"datasets": list(scope.datasets),
                               "agent_models": list(scope.agent_models),
                               "domains": list(scope.domains)}
        with store.connect(db) as con:
            create_run(con, run_id, lab.name, model=lab.model,
                       prompt_sha256=lab.prompt_sha256(caps), params=params, status="running")
            # who writes it: a listing tells a killed run (writer gone) from a live one
            store_labels.set_run_status(con, run_id, "running", writer_tag(), None)
        summaries.append(_label_run(db, lab, run_id, caps, transcripts, seed=r, n_runs=runs,
                                    progress=progress, offset=r * len(transcripts),
                                    total=total))
    return summaries


def fence_setting(lab: Labeler) -> dict[str, str]:
    """The labeler's fence key as a run setting ({} for a labeler without a fence): kept
    in the run's params so a resume or a rerun sends the same prompts (`label_prompt`)."""
    key = getattr(lab, "fence_key", None)
    return {"fence_key": key} if isinstance(key, str) and key else {}


def _resume(db: str | Path | None, run_id: str, labeler: str | Labeler | None,
            progress: Progress | None, cfg: dict[str, Any]) -> RunSummary:
    plan = _resume_plan(db, run_id)
    name = plan["labeler"]
    if isinstance(labeler, str) and labeler != name:
        raise UserInputError(f"label --resume {run_id}: the run was labeled by {name!r}, not "
                             f"{labeler!r}; resume it with --labeler {name}")
    if labeler is None or isinstance(labeler, str):
        if name in ("anthropic", "openai"):
            if not cfg.get("model") and plan["model"]:
                cfg = {**cfg, "model": plan["model"]}
            if not cfg.get("fence_key") and plan["params"].get("fence_key"):
                # the run's own key: the resumed requests are fenced as the first ones were
                cfg = {**cfg, "fence_key": plan["params"]["fence_key"]}
        else:
            cfg = {}  # the LLM options a front end passes mean nothing to this labeler
        lab = get_labeler(name, **cfg)
    else:
        lab = labeler
    caps, _ = _select(db, plan["capabilities"], None)
    params = plan["params"]
    with store.connect(db) as con:
        transcripts = load_transcripts(con, plan["todo"])
    set_run_status(db, run_id, "running", writer_tag())
    return _label_run(db, lab, run_id, caps, transcripts, seed=int(params.get("seed", 0)),
                      n_runs=int(params.get("n_runs", 1)), progress=progress, offset=0,
                      total=len(transcripts), already=plan["n_done"])


def _label_run(db: str | Path | None, lab: Labeler, run_id: str, caps: list[Capability],
               transcripts: list[Any], *, seed: int, n_runs: int, progress: Progress | None,
               offset: int, total: int, already: int = 0) -> RunSummary:
    """Label `transcripts` into run `run_id` (status 'running') and record how it ended."""
    sink = _Sink(db, hold=bool(getattr(lab, "fast", False)))
    try:
        return _label_loop(lab, run_id, caps, transcripts, sink, seed=seed, n_runs=n_runs,
                           progress=progress, offset=offset, total=total, already=already,
                           chunk=WRITE_CHUNK)
    finally:
        sink.close()


def _label_loop(lab: Labeler, run_id: str, caps: list[Capability], transcripts: list[Any],
                sink: _Sink, *, seed: int, n_runs: int, progress: Progress | None,
                offset: int, total: int, already: int, chunk: int) -> RunSummary:
    usage, n_failed, n_labels, streak, done = Usage(), 0, 0, 0, offset
    grounds = Grounds()
    first_error: str | None = None
    pending: list[TrajectoryLabels] = []
    pool: ThreadPoolExecutor | None = None

    def one(t: Any) -> TrajectoryLabels:
        return lab.label(t, caps, seed=seed, n_runs=n_runs)

    try:
        preflight = getattr(lab, "preflight", None)
        if callable(preflight):
            preflight()
        label_many = getattr(lab, "label_many", None)
        if label_many is not None and getattr(lab, "batch", False):
            results_iter = iter(label_many(transcripts, caps, seed=seed, n_runs=n_runs))
        elif lab.concurrency > 1:
            pool = ThreadPoolExecutor(max_workers=lab.concurrency)
            results_iter = _bounded_map(pool, one, transcripts, 2 * lab.concurrency)
        else:
            results_iter = map(one, transcripts)
        for res in results_iter:
            pending.append(res)
            usage.add(res.usage)
            grounds.add(res)
            failed_here = [p for p in res.labels if p.value is None]
            n_failed += len(failed_here)
            n_labels += len(res.labels)
            if failed_here and first_error is None:
                first_error = failed_here[0].error
            streak = streak + 1 if res.labels and len(failed_here) == len(res.labels) else 0
            done += 1
            if progress:
                progress(done, total)
            if len(pending) >= chunk:
                sink.write(run_id, pending)
                pending = []
            if streak >= FAIL_FAST_AFTER and n_failed == n_labels:
                raise LabelRunFailed(run_id, f"the first {streak} trajectories failed on every "
                                     f"pair; first error: {first_error}")
    except LabelerUnavailable as exc:
        _close_failed(sink, run_id, pending, pool, str(exc), _notes(lab))
        raise LabelRunFailed(run_id, str(exc)) from None
    except LabelRunFailed as exc:
        _close_failed(sink, run_id, pending, pool, exc.reason, _notes(lab))
        raise
    except KeyboardInterrupt:
        _close_failed(sink, run_id, pending, pool, "interrupted (Ctrl-C)", _notes(lab))
        raise
    except Exception as exc:
        _close_failed(sink, run_id, pending, pool, f"{type(exc).__name__}: {exc}",
                      _notes(lab))
        raise
    if pool is not None:
        pool.shutdown(wait=True)
    if pending:
        sink.write(run_id, pending)
    cost = usage.to_dict(lab.model) if lab.model else usage.to_dict()
    cost["n_failed_pairs"] = n_failed
    if already:
        cost["resumed_after"] = already
    notes = _notes(lab)
    if n_labels and n_failed == n_labels:
        reason = f"all {n_failed} pairs failed; first error: {first_error}"
        sink.status(run_id, "failed", reason, cost, notes)
        raise LabelRunFailed(run_id, reason)
    sink.status(run_id, "finished", None, cost, notes)
    return RunSummary(run_id, lab.name, len(transcripts), n_labels, n_failed, cost,
                      grounds.n_cut, grounds.n_unsupported, grounds.rates(), notes)


def _notes(lab: Labeler) -> list[str]:
    """The labeler's notes on how it sized its prompts (LLM labelers), else none."""
    return list(getattr(lab, "notes", None) or [])


def _bounded_map(pool: ThreadPoolExecutor, fn: Callable[[Any], TrajectoryLabels],
                 items: list[Any], ahead: int) -> Iterator[TrajectoryLabels]:
    """`pool.map` in order, but never more than `ahead` calls submitted and not consumed:
    when the run stops (fail fast, Ctrl-C) few calls are in flight to waste."""
    queue: deque[Future[TrajectoryLabels]] = deque()
    it = iter(items)
    for item in it:
        queue.append(pool.submit(fn, item))
        if len(queue) >= ahead:
            break
    while queue:
        result = queue.popleft().result()
        for item in it:
            queue.append(pool.submit(fn, item))
            break
        yield result


def _close_failed(sink: _Sink, run_id: str, pending: list[TrajectoryLabels],
                  pool: ThreadPoolExecutor | None, reason: str,
                  notes: list[str] | None = None) -> None:
    """Keep what was labeled (a resume starts from it) and mark the run failed."""
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
    if pending:
        sink.write(run_id, pending)
    sink.status(run_id, "failed", reason, None, notes or None)
