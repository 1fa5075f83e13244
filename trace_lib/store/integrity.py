"""What `store check` verifies of a store file and its side search index, as SQL.

Design decisions
- Every check returns `Finding`s (what was checked, whether it holds, what was found, what
  to do), never raises for what it finds: a report lists every problem at once, not the
  first. The use-case layer (`workbench.store_admin`) adds the one check that needs a stage
  (materialised labels against their definition, `diagnose.materialise`) and decides the
  exit status.
- Damage is found by reading, not by trusting the open: DuckDB opens a file by its header
  and catalog and reads data blocks lazily, so a file truncated past its catalog opens and
  fails only when a lost block is read. `read_tables` reads every row of every base table
  (a count and an order-independent hash of the rows), which reads every block.
- Row counts per dataset against the import's own report of them: the importer writes the
  number of trajectories its imports added to a dataset (`datasets.n_trajectories`, the
  report's count; schema version 10), the valid record count (`n_records`) and each
  trajectory's message and tool-call counts (`trajectories.n_messages`, `n_tool_calls`)
  from the records it parsed. A dataset must hold exactly the trajectories its imports
  reported (a dataset imported before version 10: at most `n_records`), and the message
  and tool-call rows of its trajectories must number exactly what their counts say. Rows
  whose parent is gone (a message of no trajectory, a trajectory of no dataset) are listed
  too.
- One row per identity in the unkeyed tables (`store.row_identity`: a trajectory id, a
  message, a tool call, a labelled pair of a run), which no key refuses a second of
  (schema versions 14 and 15); the repair keeps each identity's first written row.
- The search index against the messages: it must have a document for every trajectory
  (`search.index_state`), and a seeded sample of trajectories (`sample`, ordered by a hash
  of the id, so the same store gives the same sample) must be found by a word of their own
  conversation, read from the messages now. A contentless FTS5 index keeps no text to
  compare, so a query per sampled trajectory is how its postings are checked.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import duckdb

from trace_lib.store import migrations, row_identity, search
from trace_lib.store.connection import damage_error

REPAIR = "python -m trace_lib store check --repair"


@dataclass(frozen=True)
class Finding:
    check: str  # schema | tables | datasets | trajectory rows | label rows | labels | search index
    ok: bool
    message: str
    fix: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"check": self.check, "ok": self.ok, "message": self.message, "fix": self.fix}


def schema(con: duckdb.DuckDBPyConnection) -> Finding:
    version = migrations.schema_version(con)
    if version == migrations.SCHEMA_VERSION:
        return Finding("schema", True, f"schema version {version} (this trace_lib's)")
    if version < migrations.SCHEMA_VERSION:
        return Finding("schema", True, f"schema version {version}, older than this "
                       f"trace_lib's {migrations.SCHEMA_VERSION}: migrated on the first "
                       "write", None)
    return Finding("schema", False, f"schema version {version}, newer than this trace_lib's "
                   f"{migrations.SCHEMA_VERSION}", "open it with the trace_lib that wrote it")


def read_tables(con: duckdb.DuckDBPyConnection, path: Path | str) -> tuple[list[Finding],
                                                                         dict[str, int]]:
    """Read every row of every base table; (findings, row counts of the readable tables)."""
    names = [r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND "
        "table_type = 'BASE TABLE' ORDER BY 1").fetchall()]
    counts: dict[str, int] = {}
    bad: list[Finding] = []
    for name in names:
        try:
            n = con.execute(f'SELECT count(*), sum(hash(t::VARCHAR)) FROM "{name}" t'
                            ).fetchall()[0][0]
            counts[name] = int(n)
        except duckdb.Error as exc:
            damaged = damage_error(path, exc)
            bad.append(Finding("tables", False, f"table {name} cannot be read: "
                               f"{str(exc).splitlines()[0]}",
                               str(damaged).split("What to do: ", 1)[-1] if damaged else None))
    if not bad:
        bad.append(Finding("tables", True, f"{len(names)} tables read in full, "
                           f"{sum(counts.values())} rows"))
    return bad, counts


_PER_DATASET = """
SELECT d.id, d.name, d.n_records, {reported} AS reported,
       count(t.id) AS n_traj,
       coalesce(sum(t.n_messages), 0) AS want_messages,
       coalesce(sum(m.n), 0) AS got_messages,
       coalesce(sum(t.n_tool_calls), 0) AS want_calls,
       coalesce(sum(c.n), 0) AS got_calls
FROM datasets d
LEFT JOIN trajectories t ON t.dataset_id = d.id
LEFT JOIN (SELECT trajectory_id, count(*) AS n FROM messages GROUP BY 1) m
  ON m.trajectory_id = t.id
LEFT JOIN (SELECT trajectory_id, count(*) AS n FROM tool_calls GROUP BY 1) c
  ON c.trajectory_id = t.id
GROUP BY ALL ORDER BY d.name, d.id
"""

_ORPHANS = (
    ("trajectories", "of no dataset",
     "SELECT count(*) FROM trajectories WHERE dataset_id NOT IN (SELECT id FROM datasets)"),
    ("messages", "of no trajectory",
     "SELECT count(*) FROM messages WHERE trajectory_id NOT IN (SELECT id FROM trajectories)"),
    ("tool_calls", "of no trajectory",
     "SELECT count(*) FROM tool_calls WHERE trajectory_id NOT IN "
     "(SELECT id FROM trajectories)"),
)


def dataset_counts(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """Each dataset's trajectories, messages and tool calls against what its import
    recorded; rows whose parent is gone."""
    out: list[Finding] = []
    kept = con.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema = "
                       "'main' AND table_name = 'datasets' AND column_name = 'n_trajectories'"
                       ).fetchall()[0][0]  # a store older than version 10 has no column
    rows = con.execute(_PER_DATASET.format(
        reported="d.n_trajectories" if kept else "NULL::INTEGER")).fetchall()
    for ds, name, n_records, reported, n_traj, want_m, got_m, want_c, got_c in rows:
        problems = []
        if reported is not None:
            if n_traj != reported:
                problems.append(f"{n_traj} trajectories where its imports reported adding "
                                f"{reported}")
        elif n_records is not None and n_traj > n_records:
            problems.append(f"{n_traj} trajectories, more than the {n_records} records its "
                            "import read")
        if want_m != got_m:
            problems.append(f"{got_m} message rows where its trajectories record {want_m}")
        if want_c != got_c:
            problems.append(f"{got_c} tool-call rows where its trajectories record {want_c}")
        label = f"dataset {name} ({ds})"
        if problems:
            out.append(Finding("datasets", False, f"{label}: " + "; ".join(problems),
                               "rows were lost or added outside an import: restore a backup "
                               f"(`store restore`), or delete the dataset (`datasets delete "
                               f"{ds} --yes`) and import its file again"))
        else:
            as_reported = ("as its imports reported" if reported is not None else
                           "(imported before import reports were kept)")
            out.append(Finding("datasets", True, f"{label}: {n_traj} trajectories "
                               f"{as_reported} ({n_records if n_records is not None else '?'} records "
                               f"in its file); {got_m} messages, {got_c} tool calls"))
    for table, what, sql in _ORPHANS:
        n = int(con.execute(sql).fetchall()[0][0])
        if n:
            out.append(Finding("datasets", False, f"{n} {table} rows {what}",
                               "rows were written outside an import or a delete was cut "
                               "short: restore a backup (`store restore`)"))
    if not rows:
        out.append(Finding("datasets", True, "no datasets imported"))
    return out


_TOKEN = re.compile(r"[A-Za-z0-9]{4,}")


def row_identities(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """One row per identity in the unkeyed tables (`row_identity.ROW_KEYS`): no key
    refuses a repeat, so the writers keep it and this checks it. Two findings: the
    trajectories with their messages and tool calls, and the labels."""
    out = []
    for check, tables, ok in (
            ("trajectory rows", ("trajectories", "messages", "tool_calls"),
             "one row per trajectory id, message and tool call"),
            ("label rows", ("labels",), "one row per labelled pair in every run")):
        found = []
        for table in tables:
            n_twice, shown = row_identity.repeated(con, table)
            if n_twice:
                found.append(f"{n_twice} {row_identity.identity_words(table)} have more "
                             f"than one row in {table} ({shown})")
        out.append(Finding(check, True, ok) if not found else Finding(
            check, False, "; ".join(found),
            f"`{REPAIR}` keeps the first written row of each"))
    return out


def _sample(con: duckdb.DuckDBPyConnection, n: int) -> list[tuple[str, str]]:
    """(trajectory id, its conversation text) of up to `n` trajectories, seeded by id."""
    return [(r[0], r[1] or "") for r in con.execute(f"""
        SELECT t.id, string_agg(m.content, chr(10) ORDER BY m.idx)
        FROM (SELECT id FROM trajectories ORDER BY hash(id), id LIMIT ?) t
        LEFT JOIN messages m ON m.trajectory_id = t.id AND m.content IS NOT NULL
             AND m.{search.CONVERSATION}
        GROUP BY t.id ORDER BY hash(t.id), t.id""", [n]).fetchall()]


def set_aside_unreadable_index(db: Path) -> Path | None:
    """Rename the search index of store `db` to `<index>.unreadable-<UTC time>` when SQLite
    cannot read it (a rebuild could not open it); returns the new name, or None."""
    from datetime import UTC, datetime

    path = search.index_path(db)
    if not path.exists():
        return None
    try:
        lite = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
        try:
            lite.execute("PRAGMA user_version").fetchall()
            lite.execute("SELECT count(*) FROM sqlite_master").fetchall()
        finally:
            lite.close()
        return None
    except sqlite3.Error:
        pass
    aside = path.with_name(f"{path.name}.unreadable-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
    path.rename(aside)
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    return aside


def search_index(con: duckdb.DuckDBPyConnection, sample: int = 50) -> list[Finding]:
    """The side index covers every trajectory, and finds sampled ones by their own words."""
    state = search.index_state(con, exact=True)
    fix = (f"`{REPAIR}` rebuilds it from the messages (so does `explore reindex`); until "
           "then text searches use a slower scan and give the same answers")
    if state.n_trajectories == 0:
        return [Finding("search index", True, "no trajectories to index")]
    if state.path is None or not state.path.exists():
        where = search.index_path(search.store_file(con) or Path("?"))
        return [Finding("search index", False, f"missing: {where} does not exist "
                        f"({state.n_trajectories} trajectories unindexed)", fix)]
    if state.read_error:
        return [Finding("search index", False, f"{state.path} could not be read "
                        f"(SQLite: {state.read_error})",
                        "on a full device (where even a read of a WAL-mode index needs "
                        "room for its -shm file) free some space and check again; "
                        "otherwise " + fix)]
    if not state.fresh:
        return [Finding("search index", False, f"{state.n_unindexed} of "
                        f"{state.n_trajectories} trajectories have no document in "
                        f"{state.path} (stale, unreadable or of another layout)", fix)]
    wrong: list[str] = []
    checked = 0
    lite = sqlite3.connect(f"file:{state.path}?mode=ro", uri=True, timeout=30.0)
    try:
        for tid, text in _sample(con, sample):
            words = _TOKEN.findall(text)
            if not words:
                continue
            word = max(words, key=lambda w: (len(w), w)).lower()
            row = lite.execute("SELECT rowid FROM docs WHERE trajectory_id = ?", [tid]
                               ).fetchall()
            found = bool(row) and lite.execute(
                "SELECT count(*) FROM fts WHERE fts MATCH ? AND rowid = ?",
                [f'{{body}} : "{word}"', row[0][0]]).fetchall()[0][0] > 0
            checked += 1
            if not found:
                wrong.append(f"{tid} ({word!r})")
    except sqlite3.Error as exc:
        return [Finding("search index", False, f"{state.path} cannot be read: {exc}", fix)]
    finally:
        lite.close()
    if wrong:
        return [Finding("search index", False, f"{len(wrong)} of {checked} sampled "
                        "trajectories are not found by a word of their own messages: "
                        + ", ".join(wrong[:10]), fix)]
    return [Finding("search index", True, f"{state.n_documents} documents for "
                    f"{state.n_trajectories} trajectories; {checked} sampled trajectories "
                    "found by a word of their messages")]
