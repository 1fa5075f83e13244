"""Text search over message content: a SQLite FTS5 side index, and the exact substring scan.

Design decisions
- Which index. Three candidates were tried on this machine (no network at run time):
  * DuckDB's `fts` extension is not in the `duckdb` wheel (`LOAD fts` wants
    `~/.duckdb/extensions/v2.0.1/...`, `INSTALL fts` needs extensions.duckdb.org). The
    PyPI package `duckdb-ext-fts` ships the 1.4.4 build, which DuckDB 2.0.1 refuses to
    load (extensions must match the engine's exact version), and `PRAGMA create_fts_index`
    rebuilds the whole index: it is not updated by inserts, so every import would re-index
    the store.
  * `tantivy` (Python bindings) is fast, but a new compiled dependency with its own
    writer lock and commit protocol next to DuckDB's.
  * SQLite FTS5 is in the standard library (`sqlite3`, SQLite 3.40 here), indexes
    incrementally, has its own transactions, and a prefix query over 100k documents is a
    B-tree range walk (milliseconds). It is the one chosen.
- It lives in `store/` because it is part of the store: a second file beside the DuckDB
  one, written in the import's transaction, read by explore's queries (`bind`).
- The index is a side file next to the store, `<store>.search.sqlite` (WAL mode: the page
  reads while an import writes). One document per trajectory in a *contentless* FTS5
  table (`content=''`: only the postings are kept, the text stays in DuckDB), with two
  columns: `body`, the conversation (user, assistant and tool messages joined by
  newlines), and `system`, its system prompt. `docs` maps FTS rowids to trajectory ids.
- What a search reads (issue 34): the conversation, unless the system prompt is asked
  for too (`system=True`: the page's checkbox, `explore --text-system`). A system prompt
  is the same screens of policy in every trajectory of a benchmark, so a search for
  "refund" over it matched 148 of 151 failures. The conversation is a column filter on
  the same index (`{body} : (...)`), as fast as before; every path (index, word scan,
  substring scan) reads the same messages.
- The index's layout has a version (`PRAGMA user_version`, `SCHEMA_VERSION`). An index
  of another version is not used (the scan answers, the page says to reindex), and the
  next import or `explore reindex` rebuilds it whole.
- All or nothing with the import. `pending_index` writes the new trajectories' documents
  inside a SQLite transaction while DuckDB's import transaction is still open (it reads
  the uncommitted rows), commits SQLite only after DuckDB committed, and rolls back (and
  removes a side file it created) on any failure. A crash between the two commits leaves
  the index *behind* the store, never ahead: `index_state` compares the document count
  with the store's trajectories, and a stale index is not used (the scan answers, the
  page says to run `explore reindex`, which rebuilds it from the store). A SQLite commit
  that fails after DuckDB's (a full disk) is `IndexBehind`: the import stands, the
  importer reports the lagging index as a note instead of failing a committed import.
- Query semantics (mode `words`, the default): every word of the query must start a token
  somewhere in the trajectory's conversation (`"word"*`, AND), case- and accent-insensitive,
  tokens split at anything that is not a letter or digit (FTS5 `unicode61`); a "quoted
  phrase" must appear as consecutive tokens. Mode `substring` is the exact,
  case-insensitive substring scan over the same messages' `content` (for identifiers and
  fragments a token index cannot see, like `ZFA0` inside `xZFA04Y`): seconds at 100k.
- The matching ids are computed once per (store version, query, mode) and cached in the
  process (`hits`) as an Arrow array; a page's queries semi-join the same registered
  table (`bind`) instead of re-running the scan as a subquery in each of them. They come
  out of SQLite a range of documents at a time, joined into one string that Arrow splits
  (`_index_hits`): a Python row per hit was two thirds of a search's index time.
- Hits are highlighted by the transcript renderer (`explore.transcript.Highlighter`, the one
  escaping highlighter): the page passes the query to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from trace_lib.errors import is_disk_full, writing
from trace_lib.store import chunk_stage

MODES: tuple[str, ...] = ("words", "substring")
INDEX_SUFFIX = ".search.sqlite"
TOKENIZER = "unicode61 remove_diacritics 2"
SCHEMA_VERSION = 2  # 1 (no user_version set): one `body` column holding every message
_CHUNK = 50_000  # trajectories per document query
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS docs (rowid INTEGER PRIMARY KEY, trajectory_id TEXT NOT NULL UNIQUE);
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(body, system, content='',
                                                  tokenize='{TOKENIZER}');
"""
# The messages a search reads: the conversation, or every message (`system=True`).
CONVERSATION = "role <> 'system'"


def scan_sql(system: bool = False) -> str:
    """The substring scan (the `substring` mode, and the old query path kept as
    bench/explore.py's named peer): one parameter, the lower-cased text."""
    return ("SELECT DISTINCT trajectory_id FROM messages WHERE contains(lower(content), ?)"
            + ("" if system else f" AND {CONVERSATION}"))


SCAN_SQL = scan_sql()
_WORD = re.compile(r'"([^"]*)"|(\S+)')
_HAS_TOKEN = re.compile(r"[^\W_]")


def index_path(db: str | Path) -> Path:
    """The side index of the store file `db`."""
    p = Path(db)
    return p.with_name(p.name + INDEX_SUFFIX)


def store_file(con: duckdb.DuckDBPyConnection) -> Path | None:
    """The file behind a store connection (None for an in-memory database)."""
    row = con.execute("SELECT path FROM duckdb_databases() "
                      "WHERE database_name = current_database()").fetchall()[0]
    return Path(row[0]) if row and row[0] else None


def fts_query(text: str) -> str | None:
    """The FTS5 expression for a `words` query, None when it holds no letter or digit.

    Every word becomes a quoted string (so FTS5 operators and punctuation are literal)
    with a prefix star; a quoted phrase stays a phrase. Terms are ANDed.
    """
    parts = []
    for phrase, word in _WORD.findall(text):
        term = phrase or word
        if not _HAS_TOKEN.search(term):
            continue
        quoted = '"' + term.replace('"', '""') + '"'
        parts.append(quoted if phrase else quoted + "*")
    return " AND ".join(parts) or None


# ------------------------------------------------------------------------- writing


def _open(path: Path) -> sqlite3.Connection:
    """The index for writing; one of another layout is emptied (rebuilt by the caller's
    `_add_missing`, which then finds every trajectory missing)."""
    # isolation_level=None: transactions are explicit (BEGIN/COMMIT below).
    con = sqlite3.connect(str(path), isolation_level=None, timeout=30.0)
    try:
        # SQLite's WAL open on a full device is a bare "disk I/O error": say what it was.
        with writing(f"the search index {path}", path):
            con.execute("PRAGMA journal_mode=WAL")
            if con.execute("PRAGMA user_version").fetchall()[0][0] != SCHEMA_VERSION:
                con.execute("DROP TABLE IF EXISTS docs")
                con.execute("DROP TABLE IF EXISTS fts")
                con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            con.executescript(_SCHEMA)
    except BaseException:
        con.close()
        raise
    return con


def _documents_sql(scope: str) -> str:
    """(trajectory id, conversation text, system prompt text) per trajectory."""
    return f"""
        SELECT t.id,
               coalesce(string_agg(m.content, chr(10) ORDER BY m.idx)
                        FILTER (WHERE m.{CONVERSATION}), ''),
               coalesce(string_agg(m.content, chr(10) ORDER BY m.idx)
                        FILTER (WHERE NOT m.{CONVERSATION}), '')
        FROM trajectories t LEFT JOIN messages m
          ON m.trajectory_id = t.id AND m.content IS NOT NULL
        WHERE {scope} GROUP BY t.id
    """


def _add_missing(duck: duckdb.DuckDBPyConnection, lite: sqlite3.Connection) -> int:
    """Index every store trajectory the index lacks; returns how many. Caller holds the
    SQLite transaction. Documents are built a `chunk_stage` chunk at a time, so memory
    is bounded by a chunk's text whatever the store's size, and the pass is linear."""
    # The index's ids go to DuckDB an Arrow batch at a time (a 10M index's ids as one
    # Python list are ~700 MiB); from_arrow(...).query, not register: a registered table
    # stays referenced until the import's transaction commits.
    duck.execute("CREATE OR REPLACE TEMP TABLE _search_indexed (id VARCHAR)")
    try:
        cursor = lite.execute("SELECT trajectory_id FROM docs")
        while rows := cursor.fetchmany(_CHUNK):
            duck.from_arrow(pa.table({"id": pa.array([r[0] for r in rows], pa.string())})
                            ).query("_search_batch",
                                    "INSERT INTO _search_indexed SELECT id FROM _search_batch")
        next_row = lite.execute("SELECT coalesce(max(rowid), 0) FROM docs").fetchall()[0][0] + 1
        missing = "SELECT t.id FROM trajectories t WHERE t.id NOT IN (SELECT id FROM _search_indexed)"
        with chunk_stage.staged(duck, missing) as stage:
            for prefix in stage.prefixes():
                rows = duck.execute(f"{prefix} SELECT * FROM "
                                    f"({_documents_sql('true')})").fetchall()
                ids = range(next_row, next_row + len(rows))
                lite.executemany("INSERT INTO docs (rowid, trajectory_id) VALUES (?, ?)",
                                 zip(ids, (r[0] for r in rows), strict=True))
                lite.executemany("INSERT INTO fts (rowid, body, system) VALUES (?, ?, ?)",
                                 zip(ids, (r[1] for r in rows), (r[2] for r in rows),
                                     strict=True))
                next_row += len(rows)
            return stage.n
    finally:
        duck.execute("DROP TABLE IF EXISTS _search_indexed")


class IndexBehind(Exception):  # noqa: N818 - a state, not a failure of the import
    """The store committed, the search index's own commit failed: the index is behind
    the store (not used until rebuilt); the caller reports it and carries on."""

    def __init__(self, path: Path, exc: BaseException) -> None:
        reason = "no space left on the device" if is_disk_full(exc, path) else str(exc)
        super().__init__(
            f"the search index {path} could not be updated ({reason}); the store holds "
            f"every imported row, and searches scan the store until the index is rebuilt: "
            f"`python -m trace_lib store check --repair` (or the next import) once there is "
            f"room")


@contextlib.contextmanager
def pending_index(duck: duckdb.DuckDBPyConnection, db: str | Path) -> Iterator[int]:
    """Index the store's unindexed trajectories (those of the open import transaction
    included) in a SQLite transaction that commits only if the body (DuckDB's commit)
    succeeds; yields how many documents were added."""
    path = index_path(db)
    existed = path.exists()
    lite = _open(path)
    try:
        lite.execute("BEGIN IMMEDIATE")
        try:
            with writing(f"the search index {path}", path):
                n = _add_missing(duck, lite)
            yield n
        except BaseException:
            lite.execute("ROLLBACK")
            raise
        try:
            lite.execute("COMMIT")
        except sqlite3.Error as exc:
            # DuckDB committed: the store holds the import, only the index lags (issue
            # 33: a full disk here once made a committed import read as failed).
            with contextlib.suppress(sqlite3.Error):
                lite.execute("ROLLBACK")
            raise IndexBehind(path, exc) from exc
    except BaseException:
        lite.close()
        if not existed:
            for p in (path, path.with_name(path.name + "-wal"),
                      path.with_name(path.name + "-shm")):
                p.unlink(missing_ok=True)
        raise
    lite.close()
    clear_cache()


def rebuild(duck: duckdb.DuckDBPyConnection, db: str | Path) -> int:
    """Drop and rebuild the index from the store (`explore reindex`); returns documents."""
    path = index_path(db)
    lite = _open(path)
    try:
        lite.execute("BEGIN IMMEDIATE")
        try:
            lite.execute("DROP TABLE docs")
            lite.execute("DROP TABLE fts")
            for statement in filter(str.strip, _SCHEMA.split(";\n")):
                lite.execute(statement)  # executescript would commit first
            n = _add_missing(duck, lite)
        except BaseException:
            lite.execute("ROLLBACK")
            raise
        lite.execute("COMMIT")
        lite.execute("INSERT INTO fts(fts) VALUES ('optimize')")
    finally:
        lite.close()
    clear_cache()
    return n


# ------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class IndexState:
    path: Path | None
    n_documents: int
    n_trajectories: int
    n_unindexed: int  # store trajectories without a document
    read_error: str = ""  # SQLite's message when the index could not be read at all

    @property
    def fresh(self) -> bool:
        return self.path is not None and self.n_unindexed == 0


def index_state(con: duckdb.DuckDBPyConnection, *, exact: bool = False) -> IndexState:
    """Documents in the side index vs trajectories in the store. `exact` counts the
    documents row by row (`store check`: an index damaged outside this code may have lost
    some); otherwise the largest document number is their count (below)."""
    n_traj = int(con.execute("SELECT count(*) FROM trajectories").fetchall()[0][0])
    db = store_file(con)
    path = index_path(db) if db else None
    if path is None or not path.exists():
        return IndexState(None, 0, n_traj, n_traj)
    lite = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    try:
        if lite.execute("PRAGMA user_version").fetchall()[0][0] != SCHEMA_VERSION:
            return IndexState(path, 0, n_traj, n_traj)  # another layout: rebuilt, not read
        # Documents are numbered 1.. without gaps (`_add_missing` appends at max + 1, and
        # nothing here deletes one: a rebuild drops the table), so the largest rowid is
        # their count: one B-tree descent, where count(*) walks every row (~0.6 s at 10M,
        # on every first visit and every search).
        count = "count(*)" if exact else "coalesce(max(rowid), 0)"
        n_docs = int(lite.execute(f"SELECT {count} FROM docs").fetchall()[0][0])
        missing = max(n_traj - n_docs, 0)
        if n_docs > n_traj:
            # More documents than trajectories: a dataset was deleted after indexing. Its
            # documents never match (hits semi-join the store); check nothing is missing.
            ids = [r[0] for r in lite.execute("SELECT trajectory_id FROM docs")]
            con.register("_search_docs", pa.table({"id": pa.array(ids, pa.string())}))
            try:
                missing = int(con.execute(
                    "SELECT count(*) FROM trajectories "
                    "WHERE id NOT IN (SELECT id FROM _search_docs)").fetchall()[0][0])
            finally:
                con.unregister("_search_docs")
    except sqlite3.Error as e:
        # e.g. "disk I/O error": a read of a WAL-mode file must create its -shm, which a
        # full device refuses (the index may be whole); or a damaged file
        return IndexState(path, 0, n_traj, n_traj, read_error=str(e))
    finally:
        lite.close()
    return IndexState(path, n_docs, n_traj, missing)


def file_version(path: Path | None) -> tuple[float, ...]:
    """(mtime, size) of the store, its WAL, the index and its WAL: a cache key."""
    if path is None:
        return ()
    out = []
    for p in (path, path.with_name(path.name + ".wal"), index_path(path),
              index_path(path).with_name(index_path(path).name + "-wal")):
        try:
            st = p.stat()
            out += [st.st_mtime, float(st.st_size)]
        except FileNotFoundError:
            out += [0.0, 0.0]
    return tuple(out)


@dataclass(frozen=True)
class Hits:
    array: pa.Array  # the matching trajectory ids (strings), in no particular order
    source: str  # "index" | "scan"

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self.array.to_pylist())


def hits(con: duckdb.DuckDBPyConnection, text: str, mode: str = "words", *,
         system: bool = False) -> Hits:
    """The ids of the trajectories whose conversation (with `system`, also their system
    prompt) matches `text`, cached per (store version, query)."""
    if mode not in MODES:
        raise ValueError(f"text search mode {mode!r}; expected one of {MODES}")
    db = store_file(con)
    text = text.strip()
    if db is None:  # an in-memory store has no version to key a cache on
        return _hits_uncached(con, text, mode, system)
    key = (str(db), file_version(db), text, mode, system)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    found = _CACHE[key] = _hits_uncached(con, text, mode, system)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return found


_CACHE: OrderedDict[tuple, Hits] = OrderedDict()
_CACHE_SIZE = 64


def clear_cache() -> None:
    _CACHE.clear()


def _hits_uncached(con: duckdb.DuckDBPyConnection, text: str, mode: str,
                   system: bool) -> Hits:
    query = fts_query(text) if mode == "words" else None
    if query is not None:
        state = index_state(con)
        if state.fresh and state.path is not None:
            lite = sqlite3.connect(f"file:{state.path}?mode=ro", uri=True, timeout=30.0)
            try:
                found = _index_hits(lite, query if system else f"{{body}} : ({query})")
            finally:
                lite.close()
            return Hits(found, "index")
        # No fresh index (a store written without the importer, an interrupted index):
        # the same meaning by regular expressions over the same documents, in DuckDB.
        return Hits(_word_scan(con, text, system), "scan")
    if mode == "words":  # no letter or digit in the query: nothing a token can match
        return Hits(_NONE, "index")
    return Hits(_ids(con, scan_sql(system), [text.lower()]), "scan")


_NONE = pa.array([], pa.string())
_HITS_RANGE = 1_000_000  # documents per group_concat: one range's ids as one string


def _index_hits(lite: sqlite3.Connection, match: str) -> pa.Array:
    """The ids of the documents `match`es. A Python row per hit (every id a str, then a
    tuple, then an Arrow array) cost 0.58 s CPU for 1M hits; SQLite joins a range of
    documents' ids into one string and Arrow splits it: 0.30 s, a range at a time so the
    string stays bounded. An id holding the separator makes the split miscount: that range
    is read row by row."""
    last = lite.execute("SELECT coalesce(max(rowid), 0) FROM docs").fetchall()[0][0]
    joined = "FROM fts JOIN docs d ON d.rowid = fts.rowid WHERE fts MATCH ? " \
             "AND fts.rowid BETWEEN ? AND ?"
    parts = []
    for lo in range(1, last + 1, _HITS_RANGE):
        args = [match, lo, lo + _HITS_RANGE - 1]
        n, text = lite.execute(f"SELECT count(*), group_concat(d.trajectory_id, char(10)) "
                               f"{joined}", args).fetchall()[0]
        if not n:
            continue
        ids = pc.split_pattern(pa.array([text], pa.large_string()), "\n").flatten()
        if len(ids) != n:
            ids = pa.array([r[0] for r in lite.execute(f"SELECT d.trajectory_id {joined}",
                                                         args)], pa.large_string())
        parts.append(ids.cast(pa.string()))
    return pa.concat_arrays(parts) if parts else _NONE


def _ids(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> pa.Array:
    """The first column of `sql`'s rows as an Arrow string array (no Python row each)."""
    with warnings.catch_warnings():  # the DB-API result's copy: see overview_rollup
        warnings.simplefilter("ignore", UserWarning)
        table = con.execute(sql, params).to_arrow_table()
    return table.column(0).combine_chunks().cast(pa.string()) if table.num_rows else _NONE


def word_patterns(text: str) -> list[str]:
    """One case-insensitive regular expression per term of a `words` query (RE2 and
    Python): a word starts a token, a phrase is its tokens separated by non-tokens."""
    out = []
    for phrase, word in _WORD.findall(text):
        tokens = re.findall(r"[^\W_]+", (phrase or word).lower())
        if not tokens:
            continue
        body = r"[\W_]+".join(re.escape(t) for t in tokens)
        out.append(r"(?i)(^|[\W_])" + body + (r"([\W_]|$)" if phrase else ""))
    return out


def _word_scan(con: duckdb.DuckDBPyConnection, text: str, system: bool) -> pa.Array:
    patterns = word_patterns(text)
    if not patterns:
        return _NONE
    # The two texts are joined as the index's two columns are searched: every word
    # somewhere in the document (a phrase never spans the two).
    doc = "body || chr(10) || chr(10) || sys" if system else "body"
    conds = " AND ".join(f"regexp_matches({doc}, ?)" for _ in patterns)
    return _ids(con, f"SELECT id FROM ({_documents_sql('TRUE')}) d(id, body, sys) "
                     f"WHERE {conds}", patterns)


def view_name(text: str, mode: str, system: bool = False) -> str:
    """The name under which `bind` registers a query's hits on a connection."""
    key = f"{mode}\x00{int(system)}\x00{text.strip()}"
    return "_text_hits_" + hashlib.sha1(key.encode()).hexdigest()[:12]


def bind(con: duckdb.DuckDBPyConnection, text: str, mode: str = "words", *,
         system: bool = False) -> str:
    """Register the hits of `text` on `con` as a one-column table; returns its name."""
    name = view_name(text, mode, system)
    found = hits(con, text, mode, system=system)
    con.register(name, pa.table({"trajectory_id": found.array}))
    return name
