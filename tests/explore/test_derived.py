"""Columns derived at import: equal to computing them from the raw tables, backfilled on a
store written before they existed."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

from trace_lib import store
from trace_lib.explore import clusters, embeddings, queries
from trace_lib.explore.queries import TrajectoryFilter as F
from trace_lib.store import chunk_stage, migrations, search
from trace_lib.store import derived as store_derived


def _computed_signatures(con) -> pd.DataFrame:
    """The signature of every failure from the raw tables (the definition)."""
    sql = clusters.signature_parts_sql(con, "TRUE") + """
        SELECT id AS trajectory_id, sig_error_tool AS error_tool, sig_error_kind AS error_kind,
               sig_deviation AS deviation FROM sig ORDER BY id"""
    return con.execute(sql).df()


def _derived_signatures(con) -> pd.DataFrame:
    return con.execute(
        f"SELECT d.trajectory_id, d.error_tool, d.error_kind, d.deviation "
        f"FROM {store_derived.TABLE} d JOIN trajectories t ON t.id = d.trajectory_id "
        f"WHERE NOT t.success ORDER BY d.trajectory_id").df()


def _computed_kinds(con) -> dict[str, list[str]]:
    rows = con.execute(
        f"SELECT trajectory_id, list(DISTINCT k ORDER BY k) FROM (SELECT trajectory_id, "
        f"{queries.error_kind_sql('error')} AS k FROM tool_calls WHERE error IS NOT NULL) "
        f"WHERE k IS NOT NULL GROUP BY 1").fetchall()
    return dict(rows)


def _assert_equal_to_definition(con) -> None:
    assert store_derived.ready(con)
    pd.testing.assert_frame_equal(_derived_signatures(con), _computed_signatures(con))
    kinds = dict(con.execute(
        f"SELECT trajectory_id, error_kinds FROM {store_derived.TABLE} "
        f"WHERE len(error_kinds) > 0").fetchall())
    assert kinds == _computed_kinds(con)
    assert all(k == sorted(k) for k in kinds.values())  # stored sorted: same run to run
    texts = embeddings.trajectory_texts(con, failures_only=False)
    stored = dict(con.execute(f"SELECT trajectory_id, text_sha256 FROM {store_derived.TABLE}"
                              ).fetchall())
    assert stored == dict(zip(texts.trajectory_id, texts.text_sha256, strict=True))


def test_import_derives_every_trajectory(real_db: Path):
    with store.connect(real_db, read_only=True) as con:
        _assert_equal_to_definition(con)


def _old_store(src: Path, dst: Path) -> None:
    """`src`'s data in a store at the schema version before `trajectory_derived`."""
    before = migrations.MIGRATIONS.index(migrations.EXPLORE_DERIVED)
    con = duckdb.connect(str(dst))
    migrations.apply_from(con, migrations.current_version(con), target=before)
    con.execute(f"ATTACH '{src}' AS src (READ_ONLY)")
    for table in ("datasets", "trajectories", "messages", "tool_calls", "expected_actions"):
        cols = [r[0] for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = "
            "current_database() AND table_name = ? ORDER BY ordinal_position", [table]).fetchall()]
        names = ", ".join(cols)
        con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM src.{table}")
    con.close()


def _answers(con) -> tuple:
    kinds = queries.filter_options(con).query("field == 'error_kind'").value.tolist()
    flt = F(error_kinds=tuple(kinds[:2]))
    return (queries.filter_options(con), clusters.signature_counts(con),
            clusters.signature_members(con, path=["user_stop"], limit=10**6),
            queries.list_trajectories(con, flt, limit=10**6),
            embeddings.missing_embeddings(con, failures_only=False))


def test_backfill_on_an_old_store(real_db: Path, tmp_path: Path):
    old = tmp_path / "old.duckdb"
    _old_store(real_db, old)
    with store.connect(real_db, read_only=True) as con:
        want = _answers(con)
    with store.connect(old, read_only=True) as con:  # not migrated: computed path
        assert not store_derived.table_exists(con) and not store_derived.ready(con)
        got = _answers(con)
    with store.connect(old) as con:  # migrated: the table exists, still empty
        assert store_derived.table_exists(con) and not store_derived.ready(con)
        report = store_derived.rebuild(con, old)
        n = con.execute("SELECT count(*) FROM trajectories").fetchall()[0][0]
        assert report == {"derived": n, "indexed": n}
        _assert_equal_to_definition(con)
        assert store_derived.rebuild(con, old)["derived"] == 0  # nothing left to backfill
    with store.connect(old, read_only=True) as con:
        assert search.index_state(con).fresh
        after = _answers(con)
    for a, b, c in zip(want, got, after, strict=True):
        if isinstance(a, pd.DataFrame):
            a, b, c = (x.drop(columns=["examples"], errors="ignore") for x in (a, b, c))
            pd.testing.assert_frame_equal(a, b)
            pd.testing.assert_frame_equal(a, c)
        else:
            assert a == b == c


def test_text_hash_in_sql_matches_the_python_definition(tmp_path: Path):
    """`derived` computes the embedding text's hash in SQL: the same text as
    `embeddings.compose_text` on strings where SQL and Python could differ (whitespace
    that `str.strip` removes, cuts through multi-byte and combining characters, sort
    order of non-ASCII errors, empty and missing parts)."""
    import json

    from trace_lib.ingest import ingest_paths

    req_n, err_n, turn_n = embeddings.TEXT_CHARS
    odd_space = "\u3000\x1c\x1f\x0b\x85\xa0\u2028\u202f \t\n"
    texts = [
        odd_space + "héllo" + odd_space,
        "é" * (req_n - 1) + "e\u0301" + "😀" * 5,
        "😀" * (req_n + 3),
        "\u200b zero width is not space \u200b",
        "x" * (turn_n + 50),
        "ab",
    ]
    lines = []
    for i, text in enumerate(texts):
        messages = [{"role": "user", "content": text},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": f"c{i}", "type": "function",
                         "function": {"name": "zeta" if i % 2 else "Ärger", "arguments": "{}"}},
                        {"id": f"d{i}", "type": "function",
                         "function": {"name": "alpha", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": f"Error: {text}"},
                    {"role": "tool", "tool_call_id": f"d{i}", "content": "Error: é" * 60},
                    {"role": "assistant", "content": text[::-1] + odd_space},
                    {"role": "assistant", "content": odd_space},
                    {"role": "assistant", "content": "done " + text}]
        lines.append({"id": f"r{i}", "reward": 0.0, "messages": messages[: 3 + i]})
    lines.append({"id": "bare", "reward": 1.0, "messages": [{"role": "system", "content": "s"}]})
    data = tmp_path / "hard.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in lines) + "\n", encoding="utf-8")
    db = tmp_path / "hard.duckdb"
    ingest_paths([data], db=db)
    with store.connect(db, read_only=True) as con:
        texts_df = embeddings.trajectory_texts(con, failures_only=False)
        stored = dict(con.execute(f"SELECT trajectory_id, text_sha256 FROM {store_derived.TABLE}"
                                  ).fetchall())
    assert len(stored) == len(lines)
    assert stored == dict(zip(texts_df.trajectory_id, texts_df.text_sha256, strict=True))


def test_whitespace_set_is_str_isspace():
    """The spelt-out set `derived` strips in SQL is exactly what `str.strip()` strips."""
    assert store_derived._PY_WHITESPACE == "".join(
        c for c in map(chr, range(0x110000)) if c.isspace())


def test_a_chunk_at_a_time_gives_what_one_pass_gives(real_db: Path, tmp_path: Path,
                                                      monkeypatch):
    """`chunk_stage` stages the trajectories once and reads each chunk's own rows; with
    chunks of 7 (hundreds of them here) the derived rows still equal the definition and
    every search finds what the index built at import finds."""
    old = tmp_path / "old.duckdb"
    _old_store(real_db, old)
    monkeypatch.setattr(chunk_stage, "CHUNK", 7)
    with store.connect(old) as con:
        n = con.execute("SELECT count(*) FROM trajectories").fetchall()[0][0]
        assert n > 7 * 20
        assert store_derived.rebuild(con, old) == {"derived": n, "indexed": n}
        _assert_equal_to_definition(con)
    words = ("reservation", "cancel", "refund", "baggage", "insurance", "script")
    with store.connect(real_db, read_only=True) as con:
        want = [sorted(search.hits(con, w).ids) for w in words]
    with store.connect(old, read_only=True) as con:
        assert search.index_state(con).fresh
        # documents are numbered in another order: the same ids, not the same order
        assert [sorted(search.hits(con, w).ids) for w in words] == want
        assert all(want)
