"""Labels as people see and change them: grid, edits with undo, review queue, CSV.

Design decisions
- Human edits are append-only rows in `label_edits` (editor, note, time). Undo appends
  a row that names the edit it reverts (`undoes`); the effective label then falls back
  to the previous edit, else the majority over runs. Nothing is ever deleted, so "who
  changed what, and when" is the table itself.
- An edit does not touch `labels`: the views apply it (the definition), and
  `materialise.sync` patches the materialised tables (`label_pairs` and the ranking's
  counts) in the same call, so every run, the pooled majority and the ranking see it on
  the next query. Readers here read `label_pairs` (milliseconds at 100k x 10 runs).
- A `Scope` (datasets, agent models, domains) narrows the grid, the review queue and the
  CSV export; the export qualifies every row with dataset name, task id and trial.
- The grid is wide (one column per capability) because that is what `st.data_editor`
  edits; `grid_changes` turns an edited grid back into (trajectory, capability, value)
  edits so the page stays free of logic.
- The review queue orders pairs by disagreement between runs (1 - agreeing/total),
  then by how many runs voted, skipping pairs a person already decided.
- CSV import validates every row before writing anything (unknown ids, capabilities or
  values are one error listing the first offending lines); `trajectory_id` accepts the
  store's id or the source id from the imported file when that is unambiguous.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from trace_lib import store
from trace_lib.data_model import LABEL_VALUES
from trace_lib.diagnose import materialise
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope

IMPORT_COLUMNS = ("trajectory_id", "capability", "value")
# The export adds where each trajectory comes from (import ignores these columns).
EXPORT_COLUMNS = (*IMPORT_COLUMNS, "dataset", "task_id", "trial")


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


def _capability_names(con: duckdb.DuckDBPyConnection, include_rejected: bool = False) -> list[str]:
    from trace_lib.diagnose.capability_curation import ensure_builtin

    ensure_builtin(con)
    sql = "SELECT name FROM capabilities" + ("" if include_rejected else
                                             " WHERE status != 'rejected'")
    return [r[0] for r in con.execute(sql + " ORDER BY name").fetchall()]


def create_run(con: duckdb.DuckDBPyConnection, run_id: str, labeler: str, *,
               model: str | None = None, prompt_sha256: str | None = None,
               params: dict[str, Any] | None = None, status: str = "running") -> None:
    """A new label run row; the labeler writes 'running' and finishes it (see labeling)."""
    if con.execute("SELECT 1 FROM label_runs WHERE id = ?", [run_id]).fetchone():
        raise UserInputError(f"label run {run_id!r} already exists; choose another --run name")
    con.execute("INSERT INTO label_runs (id, labeler, model, prompt_sha256, params, status) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [run_id, labeler, model, prompt_sha256, json.dumps(params or {}), status])


# ---------------------------------------------------------------------------- edits

def _current(con: duckdb.DuckDBPyConnection, pairs: list[tuple[str, str]]
             ) -> dict[tuple[str, str], str | None]:
    """The effective value of each pair now (one read of the materialised pairs)."""
    materialise.sync(con)
    rows = con.execute("""SELECT p.trajectory_id, p.capability, p.value FROM label_pairs p
                          SEMI JOIN (SELECT unnest(?::VARCHAR[]) AS t, unnest(?::VARCHAR[]) AS c) x
                            ON p.trajectory_id = x.t AND p.capability = x.c""",
                       [[t for t, _ in pairs], [c for _, c in pairs]]).fetchall()
    return {(t, c): v for t, c, v in rows}


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
        caps = set(_capability_names(con, include_rejected=True))
        known = {r[0] for r in con.execute(
            "SELECT id FROM trajectories WHERE list_contains(?::VARCHAR[], id)",
            [sorted({t for t, _, _ in edits})]).fetchall()}
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
                ids.append(con.execute(
                    "INSERT INTO label_edits (trajectory_id, capability, old, new, editor, note) "
                    "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                    [tid, cap, current.get((tid, cap)), new, editor.strip(), note]).fetchone()[0])
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
    caps = [c for c in grid.columns if c not in _GRID_META]
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
            row = con.execute("SELECT edit_id FROM latest_label_edits WHERE trajectory_id = ? "
                              "AND capability = ?", [trajectory_id, capability]).fetchone()
            if not row:
                raise UserInputError(f"undo: no edit to undo on ({trajectory_id}, {capability})")
            edit_id = int(row[0])
        row = con.execute("SELECT trajectory_id, capability, old, new, undoes FROM label_edits "
                          "WHERE id = ?", [edit_id]).fetchone()
        if not row:
            raise UserInputError(f"undo: no edit with id {edit_id}")
        tid, cap, _old, new, undoes = row
        if undoes is not None:
            raise UserInputError(f"undo: edit {edit_id} is itself an undo; edit the label instead")
        if con.execute("SELECT 1 FROM label_edits WHERE undoes = ?", [edit_id]).fetchone():
            raise UserInputError(f"undo: edit {edit_id} was already undone")
        # `new` of an undo row records the value the pair falls back to, for the history.
        prev = con.execute("""
            SELECT new FROM label_edits
            WHERE trajectory_id = ? AND capability = ? AND undoes IS NULL AND id != ?
              AND id NOT IN (SELECT undoes FROM label_edits WHERE undoes IS NOT NULL)
            ORDER BY id DESC LIMIT 1""", [tid, cap, edit_id]).fetchone()
        if prev is None:
            materialise.sync(con)
            prev = con.execute("SELECT majority FROM label_pairs WHERE trajectory_id = ? "
                               "AND capability = ? AND majority IS NOT NULL",
                               [tid, cap]).fetchone()
        fallback = prev[0] if prev else "na"
        placeholder = con.execute(
            "INSERT INTO label_edits (trajectory_id, capability, old, new, editor, note, undoes) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            [tid, cap, new, fallback, editor, f"undo of edit {edit_id}", edit_id]).fetchone()[0]
        materialise.sync(con)
        return int(placeholder)


def edit_history(db: str | Path | None, *, trajectory_id: str | None = None,
                 capability: str | None = None, limit: int = 200) -> pd.DataFrame:
    where, params = [], []
    if trajectory_id:
        where.append("trajectory_id = ?")
        params.append(trajectory_id)
    if capability:
        where.append("capability = ?")
        params.append(capability)
    sql = ("SELECT id, trajectory_id, capability, old, new, editor, note, edited_at, undoes, "
           "id IN (SELECT undoes FROM label_edits WHERE undoes IS NOT NULL) AS undone "
           "FROM label_edits" + (" WHERE " + " AND ".join(where) if where else "")
           + f" ORDER BY id DESC LIMIT {int(limit)}")
    with store.connect(db) as con:
        return con.execute(sql, params).df()


# ----------------------------------------------------------------------------- grid

_GRID_META = ("trajectory_id", "task_id", "domain", "success")


def label_grid(db: str | Path | None, flt: LabelFilter | None = None) -> pd.DataFrame:
    """Trajectories x capabilities of effective labels (None where never labeled)."""
    flt = flt or LabelFilter()
    with store.connect(db) as con:
        materialise.sync(con)
        caps = flt.capabilities or _capability_names(con)
        sc, sp = (flt.scope or Scope()).where(con, "t")
        where, params = [sc], list(sp)
        if flt.success is not None:
            where.append("t.success = ?")
            params.append(flt.success)
        if flt.domain:
            where.append("t.domain = ?")
            params.append(flt.domain)
        if flt.search:
            where.append("(t.id ILIKE ? OR t.source_id ILIKE ? OR t.task_id ILIKE ?)")
            params += [f"%{flt.search}%"] * 3
        if flt.value is not None:
            where.append("""EXISTS (SELECT 1 FROM label_pairs v WHERE v.trajectory_id = t.id
                            AND v.value = ? AND list_contains(?::VARCHAR[], v.capability))""")
            params += [flt.value, caps]
        # Page first (the limit applies to trajectories, in SQL), then pivot only that page:
        # the grid stays fast on stores with 100k trajectories.
        long = con.execute(f"""
            WITH page AS (
                SELECT t.id, t.task_id, t.domain, t.success FROM trajectories t
                WHERE {' AND '.join(where)}
                  AND EXISTS (SELECT 1 FROM label_pairs l WHERE l.trajectory_id = t.id
                              AND l.n_rows > 0)
                ORDER BY t.id LIMIT {int(flt.limit)}
            )
            SELECT p.id AS trajectory_id, p.task_id, p.domain, p.success, e.capability, e.value
            FROM page p
            JOIN label_pairs e ON e.trajectory_id = p.id
            WHERE e.value IS NOT NULL AND list_contains(?::VARCHAR[], e.capability)
        """, params + [caps]).df()
    if long.empty:
        return pd.DataFrame(columns=[*_GRID_META, *caps])
    wide = long.pivot_table(index=list(_GRID_META), columns="capability", values="value",
                            aggfunc="first", dropna=False).reset_index()
    wide.columns.name = None
    for c in caps:
        if c not in wide.columns:
            wide[c] = None
    wide = wide[[*_GRID_META, *caps]]
    wide = wide[wide[caps].notna().any(axis=1)]
    return wide.sort_values("trajectory_id").reset_index(drop=True)


def grid_changes(before: pd.DataFrame, after: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(trajectory_id, capability, new) for every cell an edited grid changed."""
    caps = [c for c in before.columns if c not in _GRID_META]
    b = before.set_index("trajectory_id")
    a = after.set_index("trajectory_id")
    out = []
    for tid in a.index.intersection(b.index):
        for cap in caps:
            old, new = b.at[tid, cap], a.at[tid, cap]
            if isinstance(new, str) and new != old:
                out.append((str(tid), cap, new))
    return out


def left_out_runs_con(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Label runs that rank, the review queue and exports do not count (not finished)."""
    rows = con.execute("""
        SELECT r.id, r.status, r.status_reason,
               (SELECT count(DISTINCT trajectory_id) FROM labels l WHERE l.run_id = r.id)
        FROM label_runs r WHERE coalesce(r.status, 'finished') <> 'finished'
        ORDER BY r.started_at, r.id""").fetchall()
    return [{"run": r[0], "status": r[1], "reason": r[2], "n_trajectories_labeled": r[3]}
            for r in rows]


def left_out_runs(db: str | Path | None = None) -> list[dict[str, Any]]:
    with store.connect(db) as con:
        return left_out_runs_con(con)


def left_out_note(runs: list[dict[str, Any]]) -> str | None:
    """One sentence naming the runs left out, or None when every run finished."""
    if not runs:
        return None
    parts = [f"{r['run']} ({r['status']}, {r['n_trajectories_labeled']} trajectories labeled"
             + (f": {r['reason']}" if r.get("reason") else "") + ")" for r in runs]
    return ("left out (not finished; `label --resume RUN` completes one): "
            + "; ".join(parts))


def review_queue(db: str | Path | None, limit: int = 50, *,
                 scope: Scope | None = None) -> pd.DataFrame:
    """Pairs where the runs disagree most, not yet decided by a person (finished runs only;
    `df.attrs["left_out"]` lists the runs left out). Reads the materialised votes."""
    with store.connect(db) as con:
        left_out = left_out_runs_con(con)
        materialise.sync(con)
        sc, sp = (scope or Scope()).where(con, "t")
        df = con.execute(f"""
            SELECT v.trajectory_id, v.capability, v.majority, v.nl + v.np + v.nn AS n_runs,
                   v.nl AS n_lacking, v.np AS n_present, v.nn AS n_na,
                   1 - greatest(v.nl, v.np, v.nn) / (v.nl + v.np + v.nn) AS disagreement,
                   t.success, t.task_id
            FROM label_pairs v
            JOIN trajectories t ON t.id = v.trajectory_id
            WHERE v.edit_value IS NULL AND v.majority IS NOT NULL
              AND greatest(v.nl, v.np, v.nn) < v.nl + v.np + v.nn AND {sc}
            ORDER BY disagreement DESC, n_runs DESC, v.trajectory_id, v.capability
            LIMIT {int(limit)}
        """, sp).df()
    df.attrs["left_out"] = left_out
    return df


def evidence(db: str | Path | None, trajectory_id: str, capability: str) -> list[dict[str, Any]]:
    """Every run's label and evidence for one pair: [{run, value, evidence, error}]."""
    with store.connect(db) as con:
        rows = con.execute("""SELECT run_id, value, evidence, confidence, error FROM labels
                              WHERE trajectory_id = ? AND capability = ? ORDER BY run_id""",
                           [trajectory_id, capability]).fetchall()
    return [{"run": r[0], "value": r[1], "evidence": json.loads(r[2]) if r[2] else [],
             "confidence": r[3], "error": r[4]} for r in rows]


# ------------------------------------------------------------------------------ CSV

def export_rows(db: str | Path | None, scope: Scope | None = None) -> list[tuple[Any, ...]]:
    """Effective labels in scope, each qualified: (trajectory_id, capability, value,
    dataset name, task id, trial). Finished runs only (`left_out_runs` names the others)."""
    with store.connect(db) as con:
        materialise.sync(con)
        sc, sp = (scope or Scope()).where(con, "t")
        return con.execute(f"""
            SELECT p.trajectory_id, p.capability, p.value, d.name, t.task_id, t.trial
            FROM label_pairs p JOIN trajectories t ON t.id = p.trajectory_id
            LEFT JOIN datasets d ON d.id = t.dataset_id
            WHERE p.value IS NOT NULL AND {sc}
            ORDER BY p.trajectory_id, p.capability""", sp).fetchall()


def labels_csv(db: str | Path | None, scope: Scope | None = None) -> str:
    """The CSV export as text (the Labels page builds it only when the download is clicked)."""
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(EXPORT_COLUMNS)
    w.writerows(export_rows(db, scope))
    return buf.getvalue()


def export_labels(db: str | Path | None, path: str | Path, *,
                  scope: Scope | None = None) -> int:
    """Write effective labels as `trajectory_id,capability,value,dataset,task_id,trial`
    (import reads the first three); returns the row count."""
    rows = export_rows(db, scope)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(EXPORT_COLUMNS)
        w.writerows(rows)
    return len(rows)


def import_labels(db: str | Path | None, path: str | Path, run: str, *,
                  labeler: str = "import") -> int:
    """Import a CSV as label run `run`. Validates every row first; writes all or nothing."""
    path = Path(path)
    if not path.exists():
        raise UserInputError(f"{path}: no such file")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in IMPORT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserInputError(f"{path}: header: missing column(s) {', '.join(missing)}; "
                                 f"expected {','.join(IMPORT_COLUMNS)}")
        records = [(n, r) for n, r in enumerate(reader, start=2)]
    if not records:
        raise UserInputError(f"{path}: no label rows after the header")
    with store.connect(db) as con:
        caps = set(_capability_names(con, include_rejected=True))
        ids = {r[0] for r in con.execute("SELECT id FROM trajectories").fetchall()}
        by_source: dict[str, list[str]] = {}
        for tid, sid in con.execute("SELECT id, source_id FROM trajectories "
                                    "WHERE source_id IS NOT NULL").fetchall():
            by_source.setdefault(str(sid), []).append(tid)
        problems: list[str] = []
        rows: dict[tuple[str, str], str] = {}
        for line, rec in records:
            raw_id = (rec.get("trajectory_id") or "").strip()
            cap = (rec.get("capability") or "").strip()
            value = (rec.get("value") or "").strip().lower()
            if raw_id in ids:
                tid = raw_id
            elif len(by_source.get(raw_id, [])) == 1:
                tid = by_source[raw_id][0]
            elif len(by_source.get(raw_id, [])) > 1:
                problems.append(f"line {line}: trajectory_id {raw_id!r} matches "
                                f"{len(by_source[raw_id])} trajectories by source id; use the "
                                "store id")
                continue
            else:
                problems.append(f"line {line}: trajectory_id {raw_id!r}: no trajectory with this "
                                "store id or source id")
                continue
            if cap not in caps:
                problems.append(f"line {line}: capability {cap!r}: not in the catalog (add it "
                                "with `capabilities add`)")
            if value not in LABEL_VALUES:
                problems.append(f"line {line}: value {value!r}: expected one of "
                                f"{', '.join(LABEL_VALUES)}")
            if (tid, cap) in rows and rows[(tid, cap)] != value:
                problems.append(f"line {line}: ({raw_id}, {cap}) appears twice with different "
                                "values")
            rows[(tid, cap)] = value
        if problems:
            more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
            raise UserInputError(f"{path}: nothing imported; " + "; ".join(problems[:10]) + more)
        with store.transaction(con):
            create_run(con, run, labeler, params={"source": str(path.name)})
            df = pd.DataFrame([[run, tid, cap, v] for (tid, cap), v in rows.items()],
                              columns=["run_id", "trajectory_id", "capability", "value"])
            con.register("_import", df)
            con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                        "SELECT run_id, trajectory_id, capability, value FROM _import")
            con.unregister("_import")
            con.execute("UPDATE label_runs SET finished_at = current_timestamp, "
                        "status = 'finished' WHERE id = ?", [run])
        materialise.sync(con)  # the run counts from now: add it to the materialised labels
    return len(rows)


def label_runs(db: str | Path | None = None) -> pd.DataFrame:
    with store.connect(db) as con:
        return con.execute("""
            SELECT r.id, r.labeler, r.model, r.status, r.status_reason, r.started_at,
                   r.finished_at, r.params, r.cost,
                   count(l.trajectory_id) AS n_labels,
                   count(*) FILTER (WHERE l.error IS NOT NULL) AS n_failed
            FROM label_runs r LEFT JOIN labels l ON l.run_id = r.id
            GROUP BY ALL ORDER BY r.started_at, r.id""").df()


def transcript_with_evidence(db: str | Path | None, trajectory_id: str, capability: str
                             ) -> dict[str, Any]:
    """What the Labels page shows beside the grid: messages (tool calls inlined), every
    run's evidence for the pair, and the message indices that evidence points at."""
    from trace_lib.trajectories import load_transcript

    with store.connect(db) as con:
        t = load_transcript(con, trajectory_id)
    ev = evidence(db, trajectory_id, capability)
    points: dict[int, list[str]] = {}
    for e in ev:
        for item in e["evidence"]:
            idx = item.get("message_idx")
            if isinstance(idx, int):
                points.setdefault(idx, []).append(f"{e['run']} ({e['value']}): {item.get('text')}")
    calls: dict[int, list[str]] = {}
    for c in t.calls:
        calls.setdefault(c.message_idx, []).append(
            f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})"
            + (f"  -> error: {c.error}" if c.error else ""))
    messages = [{**m, "calls": calls.get(m["idx"], []), "evidence": points.get(m["idx"], [])}
                for m in t.messages]
    return {"trajectory_id": t.id, "task_id": t.task_id, "success": t.success,
            "messages": messages, "evidence": ev, "highlight": sorted(points)}
