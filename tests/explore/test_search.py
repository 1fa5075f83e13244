"""The full-text side index: same answers as a reference over the real store, all or
nothing with the import, stale detection and rebuild."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.explore.queries import TrajectoryFilter as F
from trace_lib.explore.queries import list_trajectories
from trace_lib.store import derived as store_derived
from trace_lib.store import search

TOKEN = re.compile(r"[^\W_]+")


def _docs(con, system: bool = False) -> dict[str, list[str]]:
    """Each trajectory's searched messages as token lists: the conversation, or (with
    `system`) every message."""
    rows = con.execute(
        "SELECT t.id, list(m.content ORDER BY m.idx) FILTER (WHERE m.content IS NOT NULL "
        f"{'' if system else ' AND m.role <> ' + repr('system')}) "
        "FROM trajectories t LEFT JOIN messages m ON m.trajectory_id = t.id GROUP BY t.id"
    ).fetchall()
    return {tid: [TOKEN.findall(c.lower()) for c in (contents or [])] for tid, contents in rows}


def _reference(docs: dict[str, list[list[str]]], word: str) -> set[str]:
    """Trajectories where `word` starts a token (the `words` mode of one word)."""
    return {tid for tid, msgs in docs.items() if any(t.startswith(word) for m in msgs for t in m)}


def _scan(con, text: str, system: bool = False) -> set[str]:
    return {r[0] for r in con.execute(search.scan_sql(system), [text.lower()]).fetchall()}


def test_index_matches_reference_and_substring_scan(real_db: Path):
    with store.connect(real_db, read_only=True) as con:
        state = search.index_state(con)
        assert state.fresh and state.n_documents == state.n_trajectories > 100
        docs = _docs(con)
        vocab = sorted({t for msgs in docs.values() for m in msgs for t in m if t.isascii()})
        # frequent, rare and identifier-like words, plus prefixes of them
        words = vocab[:: max(len(vocab) // 40, 1)] + ["reservation", "cancel", "not", "refund",
                                                       "xss", "onerror", "window"]
        words += [w[:3] for w in words[:10] if len(w) > 3]
        for w in words:
            found = search.hits(con, w)
            assert found.source == "index"
            assert set(found.ids) == _reference(docs, w), w
            assert set(found.ids) <= _scan(con, w), w  # a token prefix is a substring
        # several words: every one somewhere in the trajectory
        both = search.hits(con, "reservation cancel")
        assert set(both.ids) == _reference(docs, "reservation") & _reference(docs, "cancel")
        # the filter uses the same ids in every query of a page
        ids = set(list_trajectories(con, F(text="reservation cancel"), limit=10**6).id)
        assert ids == set(both.ids)


def test_the_system_prompt_is_searched_only_when_asked(real_db: Path):
    """Issue 34: a word of the benchmark's policy ("refund") matched nearly every
    trajectory through its system prompt. By default a search reads the conversation
    (user, assistant, tool); `system=True` adds the system prompt, on every path."""
    with store.connect(real_db, read_only=True) as con:
        conversation, everything = _docs(con), _docs(con, system=True)
        assert any(conversation[t] != everything[t] for t in conversation)  # prompts exist
        for w in ("refund", "policy", "reservation", "cancel", "baggage", "not"):
            talk, all_ = _reference(conversation, w), _reference(everything, w)
            assert set(search.hits(con, w).ids) == talk, w
            assert set(search.hits(con, w, system=True).ids) == all_, w
            assert set(search.hits(con, w, "substring").ids) == _scan(con, w)
            assert _scan(con, w) <= _scan(con, w, system=True)
            for system in (False, True):  # the page's filter asks the same
                flt = F(text=w, text_system=system)
                ids = set(list_trajectories(con, flt, limit=10**6).id)
                assert ids == (all_ if system else talk), (w, system)
        # "refund" is in the policies: the prompt alone made 178 more trajectories match
        assert len(_reference(everything, "refund")) > len(_reference(conversation,
                                                                      "refund")) + 100


def test_an_index_of_the_old_layout_is_not_read_and_is_rebuilt(tmp_path: Path):
    """An index written before the system prompt had its own column (one `body` column,
    no user_version) would answer with system-prompt hits: it is treated as stale (the
    scan answers) until the next import or `explore reindex` rebuilds it."""
    from trace_lib.ingest import ingest_paths

    db = tmp_path / "old.duckdb"
    records = [{**_record(i, f"hello {i}"), "messages": [
        {"role": "system", "content": "policy: refunds need a reason"},
        {"role": "user", "content": f"hello {i}"}]} for i in range(3)]
    ingest_paths([_write(tmp_path / "a.jsonl", records)], db=db)
    path = search.index_path(db)
    with sqlite3.connect(path) as lite:  # the old layout, as an earlier version wrote it
        lite.executescript("DROP TABLE fts; DROP TABLE docs; PRAGMA user_version = 0;"
                           "CREATE TABLE docs (rowid INTEGER PRIMARY KEY, trajectory_id TEXT);"
                           "CREATE VIRTUAL TABLE fts USING fts5(body, content='');")
    with store.connect(db, read_only=True) as con:
        tids = [r[0] for r in con.execute("SELECT id FROM trajectories").fetchall()]
    with sqlite3.connect(path) as lite:
        for i, tid in enumerate(tids, 1):
            lite.execute("INSERT INTO docs VALUES (?, ?)", [i, tid])
            lite.execute("INSERT INTO fts (rowid, body) VALUES (?, ?)",
                         [i, "policy: refunds need a reason\nhello"])
    search.clear_cache()
    with store.connect(db, read_only=True) as con:
        assert not search.index_state(con).fresh
        found = search.hits(con, "refunds")
        assert found.source == "scan" and found.ids == ()
        assert len(search.hits(con, "refunds", system=True).ids) == 3
    ingest_paths([_write(tmp_path / "b.jsonl", [_record(9, "refunds please")])], db=db)
    with store.connect(db, read_only=True) as con:
        assert search.index_state(con).fresh  # the import rebuilt it whole
        found = search.hits(con, "refunds")
        assert found.source == "index" and len(found.ids) == 1
        assert len(search.hits(con, "refunds", system=True).ids) == 4


def test_words_and_substring_agree_on_whole_words(real_db: Path):
    with store.connect(real_db, read_only=True) as con:
        for w in ("window", "reservation", "sorry"):
            sub = set(list_trajectories(con, F(text=w, text_mode="substring"), limit=10**6).id)
            assert sub == _scan(con, w)
            words = set(list_trajectories(con, F(text=w), limit=10**6).id)
            assert words <= sub


def _record(i: int, text: str) -> dict:
    return {"id": f"r{i}", "task_id": str(i), "domain": "airline", "agent_model": "m",
            "reward": 1.0, "messages": [{"role": "user", "content": text},
                                         {"role": "assistant", "content": "ok"}]}


def _write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path


def _n_docs(db: Path) -> int:
    with sqlite3.connect(search.index_path(db)) as lite:
        return lite.execute("SELECT count(*) FROM docs").fetchone()[0]


def test_aborted_import_leaves_no_index_rows(tmp_path: Path):
    from trace_lib.ingest import ingest_paths

    db = tmp_path / "s.duckdb"
    ingest_paths([_write(tmp_path / "a.jsonl", [_record(i, f"alpha {i}") for i in range(3)])],
                 db=db)
    assert _n_docs(db) == 3
    # a bad last record after rows were flushed (batch_size=1): the import fails
    bad = _write(tmp_path / "b.jsonl", [_record(i, f"bravo {i}") for i in range(10, 14)],
                 tail='{"id": "broken", "messages": "not a list"}\n')
    with pytest.raises(UserInputError):
        ingest_paths([bad], db=db, batch_size=1)
    assert _n_docs(db) == 3
    # the commit itself failing: the index rows written for it are rolled back
    with store.connect(db) as con:
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO trajectories (id, dataset_id, content_sha256) "
                    "VALUES ('t_new', 'd', 'sha_new')")
        with pytest.raises(RuntimeError), store_derived.on_import(con, db):
            assert con.execute(f"SELECT count(*) FROM {store_derived.TABLE} "
                               "WHERE trajectory_id = 't_new'").fetchall()[0][0] == 1
            raise RuntimeError("commit failed")
        con.execute("ROLLBACK")
        assert search.index_state(con).fresh
        assert con.execute(f"SELECT count(*) FROM {store_derived.TABLE}").fetchall()[0][0] == 3
    assert _n_docs(db) == 3


def test_failed_first_import_removes_the_index_file(tmp_path: Path):
    db = tmp_path / "fresh.duckdb"
    with store.connect(db) as con:
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO trajectories (id, dataset_id, content_sha256) "
                    "VALUES ('t1', 'd', 'sha1')")
        with pytest.raises(RuntimeError), store_derived.on_import(con, db):
            assert search.index_path(db).exists()
            raise RuntimeError("commit failed")
        con.execute("ROLLBACK")
    assert not search.index_path(db).exists()


def test_stale_index_falls_back_to_scan_and_reindex_repairs(tmp_path: Path):
    from trace_lib.ingest import ingest_paths

    db = tmp_path / "s.duckdb"
    ingest_paths([_write(tmp_path / "a.jsonl",
                         [_record(i, f"charlie ZFA04Y-{i} delta") for i in range(4)])], db=db)
    with store.connect(db) as con:  # rows written by hand: neither derived nor indexed
        con.execute("INSERT INTO trajectories (id, dataset_id, content_sha256, success) "
                    "VALUES ('t_hand', 'd', 'sha_hand', false)")
        con.execute("INSERT INTO messages (trajectory_id, idx, role, content) "
                    "VALUES ('t_hand', 0, 'user', 'Charlie by hand')")
    with store.connect(db, read_only=True) as con:
        assert not search.index_state(con).fresh and not store_derived.ready(con)
        found = search.hits(con, "charlie")
        assert found.source == "scan" and len(found.ids) == 5
        assert set(search.hits(con, "zfa04y").ids) == set(search.hits(con, "charlie").ids) - {
            "t_hand"}
    with store.connect(db) as con:
        assert store_derived.rebuild(con, db) == {"derived": 1, "indexed": 5}
    with store.connect(db, read_only=True) as con:
        assert search.index_state(con).fresh and store_derived.ready(con)
        found = search.hits(con, "charlie")
        assert found.source == "index" and len(found.ids) == 5


def test_fts_query_quotes_everything():
    assert search.fts_query('cancel "not found" AND x-1') == (
        '"cancel"* AND "not found" AND "AND"* AND "x-1"*')
    assert search.fts_query('--- "" ') is None
    assert search.fts_query('say "hi"" there') is not None


def test_page_use_case_reads_once_and_reports_status(real_db: Path, tmp_path: Path):
    from trace_lib.workbench import explore

    flt = F(text="reservation cancel")
    page = explore.trajectories_page(real_db, flt, limit=10**6)
    with store.connect(real_db, read_only=True) as con:
        want = set(search.hits(con, "reservation cancel").ids)
    assert set(page.overview.listing.id) == want
    assert int(page.overview.summary.n_trajectories.iloc[0]) == len(want)
    assert page.status.ok and explore.search_status(real_db).ok
    assert explore.store_version(real_db) == explore.store_version(real_db)
    with pytest.raises(UserInputError, match="no database here yet"):
        explore.reindex(tmp_path / "none.duckdb")


def test_the_fast_document_count_equals_the_exact_one(tmp_path: Path):
    """`index_state` reads the largest document number as the count: true after imports,
    a failed import and a rebuild (only damage from outside, `store check`'s case, breaks
    it, and that check counts row by row)."""
    from trace_lib.ingest import ingest_paths

    db = tmp_path / "s.duckdb"

    def agree() -> int:
        with store.connect(db, read_only=True) as con:
            fast, exact = search.index_state(con), search.index_state(con, exact=True)
        assert fast == exact
        return fast.n_documents

    ingest_paths([_write(tmp_path / "a.jsonl", [_record(i, f"echo {i}") for i in range(3)])],
                 db=db)
    assert agree() == 3
    ingest_paths([_write(tmp_path / "b.jsonl", [_record(i, f"fox {i}") for i in range(3, 7)])],
                 db=db)
    assert agree() == 7
    with pytest.raises(UserInputError):
        ingest_paths([_write(tmp_path / "c.jsonl", [_record(i, "golf") for i in range(7, 9)],
                             tail='{"id": "broken", "messages": "not a list"}\n')],
                     db=db, batch_size=1)
    assert agree() == 7
    with store.connect(db) as con:
        store_derived.rebuild(con, db)
    assert agree() == 7


def test_hits_read_in_ranges_and_ids_holding_a_newline(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    """The index's answer comes back a range of documents at a time as one joined string:
    every range size, and an id holding the separator (the importer's ids never do; a
    store written otherwise may: that range is read row by row), give the scan's ids."""
    from trace_lib.ingest import ingest_paths

    db = tmp_path / "s.duckdb"
    records = [_record(i, f"alpha {i}" if i % 3 else f"bravo {i}") for i in range(10)]
    ingest_paths([_write(tmp_path / "a.jsonl", records)], db=db)
    odd = ["line\none", "line\n\ntwo", "é \t ok"]
    with store.connect(db) as con:  # plain SQL, then `explore reindex`
        first = con.execute("SELECT min(id) FROM trajectories").fetchall()[0][0]
        for tid in odd:
            con.execute("INSERT INTO trajectories SELECT * REPLACE (? AS id) FROM trajectories "
                        "WHERE id = ?", [tid, first])
            con.execute("INSERT INTO messages SELECT * REPLACE (? AS trajectory_id, "
                        "'alpha again' AS content) FROM messages WHERE trajectory_id = ?",
                        [tid, first])
        store_derived.rebuild(con, db)
    with store.connect(db, read_only=True) as con:
        want = _scan(con, "alpha")
        assert set(odd) <= want and len(want) == 9
        for size in (1, 2, 4, 1000):
            monkeypatch.setattr(search, "_HITS_RANGE", size)
            search.clear_cache()
            found = search.hits(con, "alpha")
            assert found.source == "index" and sorted(found.ids) == sorted(want), size
            assert found.array.type == "string"
        assert search.hits(con, "nothing matches this").ids == ()
        assert set(list_trajectories(con, F(text="alpha"), limit=100).id) == want
