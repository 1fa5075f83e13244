"""Home's capability counts agree with the Labels page (issue 34).

Home said "capabilities accepted 0 / proposed 0" on a store whose Labels page listed
fourteen: the built-in menu is written on the Labels page's first visit, and Home counted
the table before that. Home now counts the catalog as that page lists it.
"""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from trace_lib import store

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def _home(db: Path, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("TRACE_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    return {m.label: m.value for m in at.metric}


def _listed(db: Path) -> dict[str, int]:
    from trace_lib.workbench import diagnose

    caps = diagnose.list_capabilities(db)  # what the Labels page lists (and writes)
    return {s: sum(c.status == s for c in caps) for s in ("accepted", "proposed")}


def test_home_counts_what_the_labels_page_lists(tmp_path, monkeypatch):
    from trace_lib.demo import build_demo

    db = tmp_path / "trace.duckdb"
    build_demo(tmp_path / "files", n=12, seed=0, db=db)
    with store.connect(db, read_only=True) as con:  # nothing written yet: the first visit
        assert con.execute("SELECT count(*) FROM capabilities").fetchone()[0] == 0
    before = _home(db, monkeypatch)
    listed = _listed(db)
    assert listed["accepted"] > 0
    assert before["capabilities accepted"] == str(listed["accepted"])
    assert before["capabilities proposed"] == "0"

    # A proposal and a rejection made on the Labels page show on Home.
    from trace_lib.workbench import diagnose

    diagnose.add_capability(db, "asks_for_the_booking_code", "asks for the code first",
                            status="proposed")
    diagnose.set_status(db, "upselling", "rejected")
    after = _home(db, monkeypatch)
    listed = _listed(db)
    assert after["capabilities accepted"] == str(listed["accepted"]) == str(
        int(before["capabilities accepted"]) - 1)
    assert after["capabilities proposed"] == str(listed["proposed"]) == "1"
