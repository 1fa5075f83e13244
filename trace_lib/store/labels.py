"""The label tables' SQL: label runs, labels, human edits, and the reads over the label
views (`latest_label_edits`, `effective_labels`, `counted_labels`) and the materialised
`label_pairs`.

Design decisions
- Writes are appends: a run row, its labels, an edit row (an undo is an edit row naming
  the edit it reverts). Nothing here deletes an edit; a label run's rows are deleted only
  to be written again (a resumed run's failed trajectories, a job's result recorded again).
- Readers of what a person sees (grid, review queue, export, the value a pair has now)
  read `label_pairs`, the materialised effective labels: the caller brings them up to
  date first (`diagnose.materialise.sync`), which keeps this module free of the
  materialisation's bookkeeping.
- A `Scope` is composed into the statement (`Scope.where`), one round trip, no id list
  pulled into Python.
- Batches of labels arrive as Arrow tables or DataFrames and are inserted through a
  registered name that is unregistered at once.
- What a label rests on is read from its own row (`cut_messages`, `cut_tokens`,
  `unsupported`, migration `LABEL_GROUNDS`) over finished runs (`counted_labels`): the
  grid's cut and unsupported columns, the queue's unsupported pairs first, and the runs'
  counts. A NULL means the labeler neither cuts nor checks evidence, and counts as neither.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store import row_identity
from trace_lib.store.connection import Connection, equals_filter

# The columns of a label row, in the order a batch carries them.
LABEL_COLUMNS = ("run_id", "trajectory_id", "capability", "value", "evidence", "confidence",
                 "error", "cut_messages", "cut_tokens", "evidence_dropped", "unsupported")


# --------------------------------------------------------------------------- label runs


def run_exists(con: Connection, run_id: str) -> bool:
    return con.execute("SELECT 1 FROM label_runs WHERE id = ?", [run_id]).fetchone() is not None


def insert_run(con: Connection, run_id: str, labeler: str, *, model: str | None,
               prompt_sha256: str | None, params: dict[str, Any], status: str) -> None:
    con.execute("INSERT INTO label_runs (id, labeler, model, prompt_sha256, params, status) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [run_id, labeler, model, prompt_sha256, json.dumps(params), status])


def run_status(con: Connection, run_id: str) -> str | None:
    """The run's status, None when there is no such run."""
    row = con.execute("SELECT status FROM label_runs WHERE id = ?", [run_id]).fetchone()
    return None if row is None else row[0]


def run_head(con: Connection, run_id: str) -> tuple[str, str | None, Any, str] | None:
    """(labeler, model, params, status) of a run, None when there is no such run."""
    return con.execute("SELECT labeler, model, params, status FROM label_runs WHERE id = ?",
                       [run_id]).fetchone()


def run_ids(con: Connection) -> list[str]:
    """Every label run, oldest first."""
    return [r[0] for r in con.execute(
        "SELECT id FROM label_runs ORDER BY started_at, id").fetchall()]


def unfinished_run_ids(con: Connection) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT id FROM label_runs WHERE status <> 'finished' ORDER BY id").fetchall()]


def running_run_params(con: Connection) -> list[tuple[str, Any]]:
    """(id, params) of every run whose status is 'running'."""
    return con.execute("SELECT id, params FROM label_runs WHERE status = 'running'").fetchall()


def set_run_status(con: Connection, run_id: str, status: str, reason: str | None,
                   cost: dict[str, Any] | None, notes: list[str] | None = None) -> None:
    """Record how a run ended (a finished run gets its finish time; a cost or notes of None
    keep the ones recorded)."""
    finished = "current_timestamp" if status == "finished" else "NULL"
    con.execute(f"UPDATE label_runs SET status = ?, status_reason = ?, "
                f"finished_at = {finished}, cost = coalesce(?, cost), "
                f"notes = coalesce(?, notes) WHERE id = ?",
                [status, reason, json.dumps(cost) if cost is not None else None,
                 "; ".join(notes) if notes else None, run_id])


def label_runs(con: Connection) -> pd.DataFrame:
    """Every run with its label and failed-pair counts, the trajectories its prompts cut
    (`n_cut`), its unsupported labels (`n_unsupported`) and, per capability, the share of
    its lacking/present labels that were unsupported (`unsupported_rate`; empty for a
    labeler that does not check evidence), oldest first."""
    df = con.execute("""
        SELECT r.id, r.labeler, r.model, r.status, r.status_reason, r.started_at,
               r.finished_at, r.params, r.cost, r.notes,
               count(l.trajectory_id) AS n_labels,
               count(*) FILTER (WHERE l.error IS NOT NULL) AS n_failed,
               count(DISTINCT l.trajectory_id) FILTER (WHERE l.cut_messages > 0
                                                       OR l.cut_tokens > 0) AS n_cut,
               count(*) FILTER (WHERE l.unsupported) AS n_unsupported
        FROM label_runs r LEFT JOIN labels l ON l.run_id = r.id
        GROUP BY ALL ORDER BY r.started_at, r.id""").df()
    rates: dict[str, dict[str, float]] = {}
    for run, cap, judged, unsupported in unsupported_counts(con):
        rates.setdefault(run, {})[cap] = round(unsupported / judged, 4) if judged else 0.0
    df["unsupported_rate"] = [rates.get(r, {}) for r in df["id"]]
    return df


def unsupported_counts(con: Connection, run_id: str | None = None
                       ) -> list[tuple[str, str, int, int]]:
    """(run, capability, lacking/present labels, unsupported ones) of the runs whose
    labeler checks evidence (every run, or `run_id`)."""
    return con.execute("""
        SELECT run_id, capability,
               count(*) FILTER (WHERE value IN ('lacking', 'present')),
               count(*) FILTER (WHERE unsupported)
        FROM labels WHERE unsupported IS NOT NULL AND (? IS NULL OR run_id = ?)
        GROUP BY ALL ORDER BY 1, 2""", [run_id, run_id]).fetchall()


def left_out_runs(con: Connection) -> list[dict[str, Any]]:
    """Label runs that rank, the review queue and exports do not count (not finished)."""
    rows = con.execute("""
        SELECT r.id, r.status, r.status_reason,
               (SELECT count(DISTINCT trajectory_id) FROM labels l WHERE l.run_id = r.id)
        FROM label_runs r WHERE coalesce(r.status, 'finished') <> 'finished'
        ORDER BY r.started_at, r.id""").fetchall()
    return [{"run": r[0], "status": r[1], "reason": r[2], "n_trajectories_labeled": r[3]}
            for r in rows]


# ------------------------------------------------------------------------------- labels


def insert_labels(con: Connection, batch: Any) -> None:
    """Append label rows (an Arrow table or DataFrame with `LABEL_COLUMNS`, or a subset of
    them: the missing columns stay NULL) on the caller's transaction.

    `labels` has no primary key (migration LABELS_UNKEYED: its index cost 20x the rows'
    bytes and twice the write's CPU), so one pair twice in a batch is refused here, before
    anything is written; a pair across batches is the writers' to avoid (a run labels a
    trajectory once; a resume first deletes what it relabels), and `store check` finds
    any that got through."""
    names = batch.column_names if hasattr(batch, "column_names") else list(batch.columns)
    cols = ", ".join(c for c in LABEL_COLUMNS if c in names)
    con.register("_new_labels", batch)
    try:
        n_twice, shown = row_identity.repeated(con, "labels", "_new_labels")
        if n_twice:
            raise UserInputError(f"labels: a pair labelled more than once in one write "
                                 f"({shown}); nothing was written")
        con.execute(f"INSERT INTO labels ({cols}) SELECT {cols} FROM _new_labels")
    finally:
        con.unregister("_new_labels")


def delete_run_labels(con: Connection, run_id: str) -> None:
    con.execute("DELETE FROM labels WHERE run_id = ?", [run_id])


def complete_trajectories(con: Connection, run_id: str) -> set[str]:
    """Trajectories the run labeled with no failed pair."""
    return {r[0] for r in con.execute(
        "SELECT trajectory_id FROM labels WHERE run_id = ? GROUP BY trajectory_id "
        "HAVING count(*) FILTER (WHERE value IS NULL) = 0", [run_id]).fetchall()}


def delete_failed_trajectories(con: Connection, run_id: str) -> None:
    """Drop every row of the run's trajectories that have a failed pair (to label again)."""
    con.execute("DELETE FROM labels WHERE run_id = ? AND trajectory_id IN (SELECT "
                "trajectory_id FROM labels WHERE run_id = ? AND value IS NULL)",
                [run_id, run_id])


def pair_evidence(con: Connection, trajectory_id: str, capability: str
                  ) -> list[tuple[Any, ...]]:
    """(run, value, evidence JSON text, confidence, error, unsupported, cut_messages,
    cut_tokens) of every run for one pair."""
    return con.execute("""SELECT run_id, value, evidence, confidence, error, unsupported,
                                 cut_messages, cut_tokens FROM labels
                          WHERE trajectory_id = ? AND capability = ? ORDER BY run_id""",
                       [trajectory_id, capability]).fetchall()


# -------------------------------------------------------------------------------- edits


def append_edit(con: Connection, trajectory_id: str, capability: str, old: str | None,
                new: str, editor: str, note: str | None, undoes: int | None = None) -> int:
    """Append an edit row (an undo when `undoes` names the edit it reverts); its id."""
    return int(con.execute(
        "INSERT INTO label_edits (trajectory_id, capability, old, new, editor, note, undoes) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        [trajectory_id, capability, old, new, editor, note, undoes]).fetchone()[0])


def latest_edit_id(con: Connection, trajectory_id: str, capability: str) -> int | None:
    """The pair's latest live edit (not an undo, not undone)."""
    row = con.execute("SELECT edit_id FROM latest_label_edits WHERE trajectory_id = ? "
                      "AND capability = ?", [trajectory_id, capability]).fetchone()
    return None if row is None else int(row[0])


def edit_row(con: Connection, edit_id: int
             ) -> tuple[str, str, str | None, str, int | None] | None:
    """(trajectory_id, capability, old, new, undoes) of an edit."""
    return con.execute("SELECT trajectory_id, capability, old, new, undoes FROM label_edits "
                       "WHERE id = ?", [edit_id]).fetchone()


def is_undone(con: Connection, edit_id: int) -> bool:
    return con.execute("SELECT 1 FROM label_edits WHERE undoes = ?",
                       [edit_id]).fetchone() is not None


def previous_live_value(con: Connection, trajectory_id: str, capability: str,
                        edit_id: int) -> str | None:
    """The value of the pair's latest live edit other than `edit_id`, None if none."""
    row = con.execute("""
        SELECT new FROM label_edits
        WHERE trajectory_id = ? AND capability = ? AND undoes IS NULL AND id != ?
          AND id NOT IN (SELECT undoes FROM label_edits WHERE undoes IS NOT NULL)
        ORDER BY id DESC LIMIT 1""", [trajectory_id, capability, edit_id]).fetchone()
    return None if row is None else row[0]


def edit_history(con: Connection, *, trajectory_id: str | None = None,
                 capability: str | None = None, limit: int = 200) -> pd.DataFrame:
    """Edits newest first, each with whether it was undone."""
    where, params = equals_filter(trajectory_id=trajectory_id, capability=capability)
    sql = ("SELECT id, trajectory_id, capability, old, new, editor, note, edited_at, undoes, "
           "id IN (SELECT undoes FROM label_edits WHERE undoes IS NOT NULL) AS undone "
           f"FROM label_edits{where} ORDER BY id DESC LIMIT {int(limit)}")
    return con.execute(sql, params).df()


def dataset_label_edits(con: Connection, dataset_id: str) -> list[dict[str, Any]]:
    """Every edit row of the dataset's trajectories, oldest first (the audit of a delete)."""
    cur = con.execute(
        "SELECT * FROM label_edits WHERE trajectory_id IN "
        "(SELECT id FROM trajectories WHERE dataset_id = ?) ORDER BY id", [dataset_id])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


# ----------------------------------------------- effective labels (`label_pairs`, views)


def pair_values(con: Connection, pairs: list[tuple[str, str]]
                ) -> dict[tuple[str, str], str | None]:
    """The effective value of each (trajectory, capability) pair that has one."""
    rows = con.execute("""SELECT p.trajectory_id, p.capability, p.value FROM label_pairs p
                          SEMI JOIN (SELECT unnest(?::VARCHAR[]) AS t, unnest(?::VARCHAR[]) AS c) x
                            ON p.trajectory_id = x.t AND p.capability = x.c""",
                       [[t for t, _ in pairs], [c for _, c in pairs]]).fetchall()
    return {(t, c): v for t, c, v in rows}


def pair_majority(con: Connection, trajectory_id: str, capability: str) -> str | None:
    """The majority over finished runs for one pair, None when no run voted."""
    row = con.execute("SELECT majority FROM label_pairs WHERE trajectory_id = ? "
                      "AND capability = ? AND majority IS NOT NULL",
                      [trajectory_id, capability]).fetchone()
    return None if row is None else row[0]


def grid_rows(con: Connection, capabilities: list[str], *, scope: Scope | None,
              success: bool | None, domain: str | None, search: str | None,
              value: str | None, limit: int) -> pd.DataFrame:
    """Effective labels of the first `limit` labeled trajectories the filter selects, long:
    trajectory_id, task_id, domain, success, capability, value."""
    sc, sp = (scope or Scope()).where(con, "t")
    where, params = [sc], list(sp)
    if success is not None:
        where.append("t.success = ?")
        params.append(success)
    if domain:
        where.append("t.domain = ?")
        params.append(domain)
    if search:
        where.append("(t.id ILIKE ? OR t.source_id ILIKE ? OR t.task_id ILIKE ?)")
        params += [f"%{search}%"] * 3
    if value is not None:
        where.append("""EXISTS (SELECT 1 FROM label_pairs v WHERE v.trajectory_id = t.id
                        AND v.value = ? AND list_contains(?::VARCHAR[], v.capability))""")
        params += [value, capabilities]
    # Page first (the limit applies to trajectories, in SQL), then the caller pivots only
    # that page. The page is the first `limit` labeled trajectories by id; a store labels
    # most of its trajectories, so they are found among the first few `limit` by id (a
    # top-N over the trajectories) before any label pair is read: the semi-join of every
    # trajectory with every pair took 21 s of CPU at 10M x 14 (bench/README, session
    # 24). Only when those candidates hold fewer than `limit` labeled ones does the page
    # come from all of them (same rows: every labeled trajectory before the last
    # candidate is a candidate).
    selected = f"SELECT t.id, t.task_id, t.domain, t.success FROM trajectories t " \
               f"WHERE {' AND '.join(where)}"
    n_candidates = 4 * int(limit)
    for candidates in (f"{selected} ORDER BY t.id LIMIT {n_candidates}", selected):
        rows = con.execute(f"""
            WITH c AS ({candidates}),
            page AS (
                SELECT c.* FROM c
                WHERE c.id IN (SELECT l.trajectory_id FROM label_pairs l
                               WHERE l.n_rows > 0
                                 AND l.trajectory_id IN (SELECT id FROM c))
                ORDER BY c.id LIMIT {int(limit)}
            )
            SELECT p.id AS trajectory_id, p.task_id, p.domain, p.success, e.capability,
                   e.value, (SELECT count(*) FROM page) AS n_page,
                   (SELECT count(*) FROM c) AS n_candidates
            FROM page p
            JOIN label_pairs e ON e.trajectory_id = p.id
            WHERE e.value IS NOT NULL AND list_contains(?::VARCHAR[], e.capability)
        """, params + [capabilities]).df()
        if not rows.empty and (int(rows["n_page"].iloc[0]) >= int(limit)
                               or int(rows["n_candidates"].iloc[0]) < n_candidates):
            break  # the page is full, or the candidates were every selected trajectory
    return rows.drop(columns=["n_page", "n_candidates"])


def grid_grounds(con: Connection, trajectory_ids: list[str], capabilities: list[str]
                 ) -> pd.DataFrame:
    """Per trajectory, over finished runs: the most any run's prompt cut (`cut_messages`,
    `cut_tokens`; NULL when no labeler cut it or none cuts) and the capabilities with an
    unsupported label (`unsupported`, comma-separated, NULL when none)."""
    return con.execute("""
        SELECT trajectory_id,
               max(cut_messages) AS cut_messages, max(cut_tokens) AS cut_tokens,
               string_agg(DISTINCT capability, ', ' ORDER BY capability)
                   FILTER (WHERE unsupported AND list_contains(?::VARCHAR[], capability))
                   AS unsupported
        FROM counted_labels
        WHERE trajectory_id IN (SELECT unnest(?::VARCHAR[]))
        GROUP BY trajectory_id""", [capabilities, trajectory_ids]).df()


# Pairs with a finished run's unsupported label (how many runs), for the review queues.
UNSUPPORTED_PAIRS = """
    SELECT trajectory_id, capability, count(*) AS n_unsupported
    FROM counted_labels WHERE unsupported GROUP BY ALL"""


def review_queue(con: Connection, limit: int, scope: Scope | None = None) -> pd.DataFrame:
    """Undecided pairs where the finished runs disagree or a run's label is unsupported:
    unsupported ones first, then the most disagreement."""
    sc, sp = (scope or Scope()).where(con, "t")
    return con.execute(f"""
        SELECT v.trajectory_id, v.capability, v.majority, v.nl + v.np + v.nn AS n_runs,
               v.nl AS n_lacking, v.np AS n_present, v.nn AS n_na,
               1 - greatest(v.nl, v.np, v.nn) / (v.nl + v.np + v.nn) AS disagreement,
               coalesce(u.n_unsupported, 0) AS n_unsupported,
               t.success, t.task_id
        FROM label_pairs v
        JOIN trajectories t ON t.id = v.trajectory_id
        LEFT JOIN ({UNSUPPORTED_PAIRS}) u
          ON u.trajectory_id = v.trajectory_id AND u.capability = v.capability
        WHERE v.edit_value IS NULL AND v.majority IS NOT NULL
          AND (greatest(v.nl, v.np, v.nn) < v.nl + v.np + v.nn OR u.n_unsupported > 0)
          AND {sc}
        ORDER BY n_unsupported > 0 DESC, disagreement DESC, n_runs DESC, v.trajectory_id,
                 v.capability
        LIMIT {int(limit)}
    """, sp).df()


def export_rows(con: Connection, scope: Scope | None = None) -> list[tuple[Any, ...]]:
    """Effective labels in scope, each qualified: (trajectory_id, capability, value,
    dataset name, task id, trial)."""
    sc, sp = (scope or Scope()).where(con, "t")
    return con.execute(f"""
        SELECT p.trajectory_id, p.capability, p.value, d.name, t.task_id, t.trial
        FROM label_pairs p JOIN trajectories t ON t.id = p.trajectory_id
        LEFT JOIN datasets d ON d.id = t.dataset_id
        WHERE p.value IS NOT NULL AND {sc}
        ORDER BY p.trajectory_id, p.capability""", sp).fetchall()


def effective_label_rows(con: Connection) -> list[tuple[str, str, str]]:
    """(trajectory_id, capability, value) of every effective label with a value."""
    return con.execute("SELECT trajectory_id, capability, value FROM effective_labels "
                       "WHERE value IS NOT NULL").fetchall()


def majority_over_runs(con: Connection, runs: list[str]) -> list[tuple[str, str, str]]:
    """(trajectory_id, capability, value): the majority over `runs` of their edited labels
    (ties: lacking > present > na)."""
    return con.execute("""
        SELECT trajectory_id, capability,
               CASE WHEN nl >= np_ AND nl >= nn THEN 'lacking'
                    WHEN np_ >= nn THEN 'present' ELSE 'na' END
        FROM (SELECT trajectory_id, capability,
                     count(*) FILTER (WHERE value = 'lacking') nl,
                     count(*) FILTER (WHERE value = 'present') np_,
                     count(*) FILTER (WHERE value = 'na') nn
              FROM effective_run_labels WHERE run_id IN (SELECT unnest(?::VARCHAR[]))
              GROUP BY ALL)""", [runs]).fetchall()


def dataset_lacking_counts(con: Connection, dataset_id: str, agent_model: str | None = None
                           ) -> list[tuple[str, int, int]]:
    """capability, lacking, labelled present or lacking over a dataset's effective labels
    (only `agent_model`'s trajectories when given)."""
    agent = "" if agent_model is None else " AND t.agent_model = ?"
    return con.execute(
        "SELECT l.capability, count(*) FILTER (l.value = 'lacking'), "
        "count(*) FILTER (l.value IN ('lacking', 'present')) "
        "FROM effective_labels l JOIN trajectories t ON t.id = l.trajectory_id "
        f"WHERE t.dataset_id = ?{agent} GROUP BY 1 ORDER BY 1",
        [dataset_id] + ([] if agent_model is None else [agent_model])).fetchall()
