"""Labels as people see and change them: grid, edits with undo, review queue.

Design decisions
- Human edits are append-only rows in `label_edits` (editor, note, time). Undo appends
  a row that names the edit it reverts (`undoes`); the effective label then falls back
  to the previous edit, else the majority over runs. Nothing is ever deleted, so "who
  changed what, and when" is the table itself.
- An edit does not touch `labels`: the views apply it (the definition), and
  `materialise.sync` patches the materialised tables (`label_pairs` and the ranking's
  counts) in the same call, so every run, the pooled majority and the ranking see it on
  the next query. Readers here read `label_pairs` (milliseconds at 100k x 10 runs).
- A `Scope` (datasets, agent models, domains) narrows the grid and the review queue (and
  the CSV export, `label_csv`).
- The grid is wide (one column per capability) because that is what `st.data_editor`
  edits; `grid_changes` turns an edited grid back into (trajectory, capability, value)
  edits so the page stays free of logic.
- The review queue puts pairs with an unsupported label first (an LLM's lacking/present
  with no evidence that quotes the transcript), then orders by disagreement between runs
  (1 - agreeing/total) and how many runs voted, skipping pairs a person already decided.
- The grid shows what its labels rest on in read-only columns after the capabilities
  (`GRID_GROUNDS`): the most any finished run's prompt cut of the trajectory
  (`cut_messages`, `cut_tokens`) and the shown capabilities with an unsupported label.
  They come last so the capability columns keep their places.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from trace_lib import store
from trace_lib.data_model import LABEL_VALUES
from trace_lib.diagnose import materialise
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store import capabilities as store_capabilities
from trace_lib.store import labels as store_labels
from trace_lib.store import trajectories as store_trajectories


@dataclass
class LabelFilter:
    capabilities: list[str] | None = None  # None = every non-rejected capability
    success: bool | None = None
    domain: str | None = None
    value: str | None = None  # keep trajectories where some shown capability has this value
    search: str | None = None  # substring of trajectory id, source id or task id
    limit: int = 500
    scope: Scope | None = None


def _check_value(value: str, where: str) -> None:
    if value not in LABEL_VALUES:
        raise UserInputError(f"{where}: value {value!r}: expected one of {', '.join(LABEL_VALUES)}")


def capability_names(con: store.Connection, include_rejected: bool = False) -> list[str]:
    """The catalog's names (the built-in menu seeded first), without rejected ones unless
    asked: what an edit or an imported label may name."""
    store_capabilities.ensure_builtin(con)
    return store_capabilities.capability_names(con, include_rejected)


# ---------------------------------------------------------------------------- edits

def _current(con: store.Connection, pairs: list[tuple[str, str]]
             ) -> dict[tuple[str, str], str | None]:
    """The effective value of each pair now (one read of the materialised pairs)."""
    materialise.sync(con)
    return store_labels.pair_values(con, pairs)


def edit_labels(db: str | Path | None, edits: list[tuple[str, str, str]], *, editor: str,
                note: str | None = None, skip_unchanged: bool = False) -> list[int]:
    """Append one edit per (trajectory_id, capability, new value); all or nothing; returns
    the new edits' ids.

    `skip_unchanged` (the Labels grid's save) records nothing for a pair whose effective
    label already is the new value: the grid a person typed into can be stale (another
    session, or this session's own earlier save still in flight when the page reloaded,
    set that value), and the same value saved twice would be a history row that changes
    nothing. Explicit edits (CLI, bulk) record every pair they are given."""
    if not editor or not editor.strip():
        raise UserInputError("label edit: editor: expected a non-empty name")
    with store.connect(db) as con:
        caps = set(capability_names(con, include_rejected=True))
        known = store_trajectories.existing_ids(con, sorted({t for t, _, _ in edits}))
        for tid, cap, new in edits:
            _check_value(new, f"edit of ({tid}, {cap})")
            if cap not in caps:
                raise UserInputError(f"edit of ({tid}, {cap}): unknown capability {cap!r}")
            if tid not in known:
                raise UserInputError(f"edit of ({tid}, {cap}): unknown trajectory id {tid!r}")
        current = _current(con, [(t, c) for t, c, _ in edits])
        if skip_unchanged:
            edits = [(t, c, v) for t, c, v in edits if current.get((t, c)) != v]
        ids: list[int] = []
        with store.transaction(con):
            for tid, cap, new in edits:
                ids.append(store_labels.append_edit(con, tid, cap, current.get((tid, cap)), new,
                                                    editor.strip(), note))
                current[(tid, cap)] = new  # a second edit of the pair starts from this one
        materialise.sync(con)  # patch the materialised labels and counts now
        return ids


def edit_label(db: str | Path | None, trajectory_id: str, capability: str, new: str, *,
               editor: str, note: str | None = None) -> int:
    return edit_labels(db, [(trajectory_id, capability, new)], editor=editor, note=note)[0]


def bulk_edit(db: str | Path | None, flt: LabelFilter, new: str, *, editor: str,
              note: str | None = None) -> list[int]:
    """Set every (trajectory, capability) cell the filter selects to `new`."""
    grid = label_grid(db, flt)
    caps = [c for c in grid.columns if c not in _GRID_META and c not in GRID_GROUNDS]
    edits = [(tid, cap, new) for tid in grid["trajectory_id"] for cap in caps
             if flt.value is None or grid.loc[grid["trajectory_id"] == tid, cap].iloc[0] == flt.value]
    if not edits:
        raise UserInputError("bulk edit: the filter selects no labels")
    return edit_labels(db, edits, editor=editor, note=note)


def undo_edit(db: str | Path | None, *, editor: str, edit_id: int | None = None,
              trajectory_id: str | None = None, capability: str | None = None) -> int:
    """Revert one edit (by id, else the pair's latest live edit); returns the undo row id."""
    with store.connect(db) as con:
        if edit_id is None:
            if not (trajectory_id and capability):
                raise UserInputError("undo: give an edit id, or a trajectory id and a capability")
            edit_id = store_labels.latest_edit_id(con, trajectory_id, capability)
            if edit_id is None:
                raise UserInputError(f"undo: no edit to undo on ({trajectory_id}, {capability})")
        row = store_labels.edit_row(con, edit_id)
        if not row:
            raise UserInputError(f"undo: no edit with id {edit_id}")
        tid, cap, _old, new, undoes = row
        if undoes is not None:
            raise UserInputError(f"undo: edit {edit_id} is itself an undo; edit the label instead")
        if store_labels.is_undone(con, edit_id):
            raise UserInputError(f"undo: edit {edit_id} was already undone")
        # `new` of an undo row records the value the pair falls back to, for the history.
        fallback = store_labels.previous_live_value(con, tid, cap, edit_id)
        if fallback is None:
            materialise.sync(con)
            fallback = store_labels.pair_majority(con, tid, cap)
        undo_id = store_labels.append_edit(con, tid, cap, new, fallback or "na", editor,
                                           f"undo of edit {edit_id}", undoes=edit_id)
        materialise.sync(con)
        return undo_id


def edit_history(db: str | Path | None, *, trajectory_id: str | None = None,
                 capability: str | None = None, limit: int = 200) -> pd.DataFrame:
    with store.connect(db) as con:
        return store_labels.edit_history(con, trajectory_id=trajectory_id,
                                         capability=capability, limit=limit)


def describe_edit(edit: dict[str, Any]) -> str:
    """One row of `edit_history` in words, for a picker: "#12 · t_0a1b · tool_calling_
    precision: lacking → present · ann, 2025-08-01 16:20" (a bare id said nothing)."""
    old = edit.get("old")
    when = edit.get("edited_at")
    when = when.strftime("%Y-%m-%d %H:%M") if hasattr(when, "strftime") else (when or "")
    return (f"#{edit['id']} · {edit['trajectory_id']} · {edit['capability']}: "
            f"{old if isinstance(old, str) else '(labeler)'} → {edit['new']} · "
            f"{edit.get('editor') or '?'}" + (f", {when}" if when else ""))


def describe_grid_save(changes: list[tuple[str, str, str]], ids: list[int],
                       at: datetime) -> str:
    """The Labels grid's confirmation of one save, shown only once `edit_labels` returned
    (committed): "saved 1 edit(s): #12 t_0a1b · tool_calling_precision → present, 16:20:05".

    It names what was stored, by edit id: two saves of one edit each used to read the
    same ("saved 1 edit(s)"), so a second confirmation arriving while the first still
    showed changed nothing on the screen, and a person (or a test) could not tell that
    the second edit was stored. The ids are History's, so the save can be found (and
    undone) there. The pairs are named when every change was stored (`ids` follow
    `changes` then); a change whose pair already had the value is only counted."""
    same = len(changes) - len(ids)
    if len(ids) == len(changes):
        items = [f"#{i} {t} · {c} → {v}" for i, (t, c, v) in zip(ids, changes, strict=True)]
    else:
        items = [f"#{i}" for i in ids]
    shown = "; ".join(items[:3]) + (f"; and {len(items) - 3} more" if len(items) > 3 else "")
    return (f"saved {len(ids)} edit(s)" + (f": {shown}" if ids else "")
            + (f"; {same} already had that value" if same else "")
            + f", {at.strftime('%H:%M:%S')}")


# ----------------------------------------------------------------------------- grid

_GRID_META = ("trajectory_id", "task_id", "domain", "success")
# Read-only columns after the capabilities: what the labels rest on (see the docstring).
GRID_GROUNDS = ("cut_messages", "cut_tokens", "unsupported")


def label_grid(db: str | Path | None, flt: LabelFilter | None = None) -> pd.DataFrame:
    """Trajectories x capabilities of effective labels (None where never labeled), then
    the `GRID_GROUNDS` columns."""
    flt = flt or LabelFilter()
    with store.connect(db) as con:
        materialise.sync(con)
        caps = flt.capabilities or capability_names(con)
        long = store_labels.grid_rows(con, caps, scope=flt.scope, success=flt.success,
                                      domain=flt.domain, search=flt.search, value=flt.value,
                                      limit=flt.limit)
        grounds = (store_labels.grid_grounds(con, list(long["trajectory_id"].unique()), caps)
                   if not long.empty else None)
    if long.empty or grounds is None:
        return pd.DataFrame(columns=[*_GRID_META, *caps, *GRID_GROUNDS])
    wide = long.pivot_table(index=list(_GRID_META), columns="capability", values="value",
                            aggfunc="first", dropna=False).reset_index()
    wide.columns.name = None
    for c in caps:
        if c not in wide.columns:
            wide[c] = None
    wide = wide[[*_GRID_META, *caps]]
    wide = wide[wide[caps].notna().any(axis=1)]
    wide = wide.merge(grounds, on="trajectory_id", how="left")
    for c in ("cut_messages", "cut_tokens"):
        wide[c] = wide[c].astype("Int64")
    wide["unsupported"] = wide["unsupported"].astype(object).where(
        wide["unsupported"].notna(), None)
    return wide.sort_values("trajectory_id").reset_index(drop=True)


def grid_changes(before: pd.DataFrame, after: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(trajectory_id, capability, new) for every cell an edited grid changed."""
    caps = [c for c in before.columns if c not in _GRID_META and c not in GRID_GROUNDS]
    b = before.set_index("trajectory_id")
    a = after.set_index("trajectory_id")
    out = []
    for tid in a.index.intersection(b.index):
        for cap in caps:
            old, new = b.at[tid, cap], a.at[tid, cap]
            if isinstance(new, str) and new != old:
                out.append((str(tid), cap, new))
    return out


def review_queue(db: str | Path | None, limit: int = 50, *,
                 scope: Scope | None = None) -> pd.DataFrame:
    """Pairs where the runs disagree most, not yet decided by a person (finished runs only;
    `df.attrs["left_out"]` lists the runs left out). Reads the materialised votes."""
    with store.connect(db) as con:
        left_out = store_labels.left_out_runs(con)
        materialise.sync(con)
        df = store_labels.review_queue(con, limit, scope)
    df.attrs["left_out"] = left_out
    return df


def evidence(db: str | Path | None, trajectory_id: str, capability: str) -> list[dict[str, Any]]:
    """Every run's label and evidence for one pair: [{run, value, evidence, error,
    unsupported, cut_messages, cut_tokens}]."""
    with store.connect(db) as con:
        rows = store_labels.pair_evidence(con, trajectory_id, capability)
    return [{"run": r[0], "value": r[1], "evidence": json.loads(r[2]) if r[2] else [],
             "confidence": r[3], "error": r[4], "unsupported": r[5], "cut_messages": r[6],
             "cut_tokens": r[7]} for r in rows]


def evidence_by_message(ev: list[dict[str, Any]]) -> dict[int, list[str]]:
    """The notes of `evidence(...)` grouped by the message each points at: message idx ->
    ["RUN (VALUE): TEXT", ...]; evidence that names no message is left out."""
    points: dict[int, list[str]] = {}
    for e in ev:
        for item in e["evidence"]:
            idx = item.get("message_idx")
            if isinstance(idx, int):
                points.setdefault(idx, []).append(f"{e['run']} ({e['value']}): {item.get('text')}")
    return points


def transcript_with_evidence(db: str | Path | None, trajectory_id: str, capability: str
                             ) -> dict[str, Any]:
    """Messages (tool calls inlined as text), every run's evidence for the pair, and the
    message indices that evidence points at: the plain view (notebooks); the Labels page
    draws the viewer's transcript (`workbench.diagnose.evidence_transcript`)."""
    from trace_lib.trajectories import load_transcript

    with store.connect(db) as con:
        t = load_transcript(con, trajectory_id)
    ev = evidence(db, trajectory_id, capability)
    points = evidence_by_message(ev)
    calls: dict[int, list[str]] = {}
    for c in t.calls:
        calls.setdefault(c.message_idx, []).append(
            f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})"
            + (f"  -> error: {c.error}" if c.error else ""))
    messages = [{**m, "calls": calls.get(m["idx"], []), "evidence": points.get(m["idx"], [])}
                for m in t.messages]
    return {"trajectory_id": t.id, "task_id": t.task_id, "success": t.success,
            "messages": messages, "evidence": ev, "highlight": sorted(points)}
