"""The landing page (app.py) under AppTest: empty states and pipeline counts."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from trace_lib import store

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def run(db: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("TRACE_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_no_database_yet(tmp_path, monkeypatch):
    at = run(tmp_path / "absent.duckdb", monkeypatch)
    assert any("make demo" in i.value and "upload" in i.value for i in at.info)
    assert metrics(at) == {}
    assert not (tmp_path / "absent.duckdb").exists()
    assert any("Trajectories" in p.proto.label for p in at.get("page_link"))


def test_empty_store_and_later_stages(tmp_path, monkeypatch):
    db = tmp_path / "trace.duckdb"
    with store.connect(db):
        pass
    at = run(db, monkeypatch)
    assert any("No trajectories yet" in i.value for i in at.info)
    m = metrics(at)
    assert m["trajectories"] == "0" and m["adapters"] == "0" and m["composed models"] == "0"


def test_counts_from_a_real_import(tmp_path, monkeypatch, shared_data):
    from trace_lib.ingest import ingest_paths

    db = tmp_path / "trace.duckdb"
    rep = ingest_paths(
        [str(shared_data / "tau-bench/historical_trajectories/gpt-4o-airline.json")], db=db)
    with store.connect(db) as con:  # later stages partly filled
        con.execute("INSERT INTO environments (id, name, capability, domain, version, source, "
                    "status) VALUES ('e1', 'env', 'cap', 'airline', 1, 'builtin', 'approved')")
    at = run(db, monkeypatch)
    m = metrics(at)
    assert m["trajectories"] == str(rep.trajectories) == "200"
    assert m["failures"] == str(rep.failures)
    # Counted as the Environments page lists them: built-ins without a review are drafts.
    from trace_lib.workbench import environments

    listed = environments.list_environments(db)
    assert m["approved"] == "1"
    assert m["draft"] == str(sum(e["status"] == "draft" for e in listed)) != "0"
    assert not at.info  # no empty-state hint once data is there
    assert any("**Next:** Label capabilities" in md.value for md in at.markdown)
