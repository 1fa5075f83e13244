"""Rankings page (Streamlit AppTest) on a real labeled demo store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.ranking import rank

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "3_Rankings.py")


@pytest.fixture(scope="module")
def labeled_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trace_lib.demo import build_demo

    root = tmp_path_factory.mktemp("rank_page")
    db = root / "demo.duckdb"
    build_demo(root / "files", n=36, seed=0, db=db)
    run_labeling(db, "heuristic", run_prefix="h")
    return db


@pytest.fixture
def labeled(labeled_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = tmp_path / "t.duckdb"
    shutil.copy(labeled_template, db)
    monkeypatch.setenv("TRACE_DB", str(db))
    return db


def test_table_charts_and_export(labeled: Path) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    table = at.dataframe[0].value
    # One heuristic run cannot show stability: the page's default (auto) ranks K-of-N over
    # bootstrap resamples and says so (diagnose.agreement).
    from trace_lib import store
    from trace_lib.diagnose.agreement import StabilityConfig, stable_ranking
    from trace_lib.diagnose.ranking import RankConfig

    with store.connect(labeled) as con:
        kept_lib = {r.capability for r in stable_ranking(con, RankConfig(), StabilityConfig()
                                                         ).ranking.selected}
    assert set(table.loc[table["kept"], "capability"]) == kept_lib and kept_lib
    assert "bootstrap resamples, not independent label runs" in at.info[0].value
    assert "scaled" in at.info[0].value
    assert kept_lib <= {r.capability for r in rank(labeled).selected}
    assert len(at.get("plotly_chart")) >= 4
    export = at.get("download_button")[0]
    assert "selected_capabilities.json" in export.proto.label and not export.proto.disabled
    assert at.metric[0].value.startswith(str(len(kept_lib)))


def test_sliders_reselect_live(labeled: Path) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    before = int(at.metric[0].value.split()[0])
    at.slider(key="rho").set_value(0.99).run()
    assert not at.exception
    assert int(at.metric[0].value.split()[0]) == 0 < before
    assert "Nothing kept" in " ".join(c.value for c in at.caption)


def test_empty_store_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "none.duckdb"))
    at = AppTest.from_file(PAGE, default_timeout=30).run()
    assert not at.exception and "No database" in at.info[0].value


def test_scope_picker_ranks_one_dataset_and_fisher_p_is_text(labeled: Path) -> None:
    """The scope picker (issue 17): choosing a dataset ranks over its trajectories only;
    Fisher p is shown as readable text (issue 17: not '000000000')."""
    from trace_lib import store
    from trace_lib.workbench import diagnose as wb

    with store.connect(labeled) as con:  # a second dataset: 10 trajectories moved into it
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d-theirs', 'theirs', 'test', 'zz')")
        con.execute("UPDATE trajectories SET dataset_id = 'd-theirs' WHERE id IN "
                    "(SELECT id FROM trajectories ORDER BY id LIMIT 10)")
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception and "Scope: all trajectories" in [c.value for c in at.caption]
    at.multiselect(key="scope_datasets").set_value(["theirs"]).run()
    assert not at.exception
    assert "Scope: dataset theirs" in [c.value for c in at.caption], [e.value for e in at.error]
    expected = wb.rankings(labeled, wb.RankConfig(), details=False,
                           stability=wb.StabilityConfig(), scope=wb.Scope(datasets=["theirs"]))
    table = at.dataframe[0].value.set_index("capability")
    for r in expected.ranking.rows:
        assert table.loc[r.capability, "LF/PF/NF"] == (
            f"{r.pooled['lf']}/{r.pooled['pf']}/{r.pooled['nf']}")
        shown = table.loc[r.capability, "Fisher p"]
        assert shown == (wb.format_p(r.fisher_p) or "—")
    assert all(isinstance(p, str) for p in table["Fisher p"])


def test_format_p_is_readable() -> None:
    from trace_lib.workbench.diagnose import format_p

    assert format_p(3.2e-07) == "3.2e-07" and format_p(0.0) == "< 1e-300"
    assert format_p(0.04123) == "0.041" and format_p(None) == "" and format_p(1.0) == "1.000"


def test_undefined_ratios_show_the_empty_marker_and_the_cover_counts_labelled(
        labeled: Path) -> None:
    """Issue 34: an undefined ratio shows "—" (the caption's marker), never "None"; the
    cover counts labelled failures and says how many failed ones no run labelled, and the
    clusters call those "(not labelled)", not "(none lacking)"."""
    from trace_lib import store
    from trace_lib.workbench import diagnose as wb

    with store.connect(labeled) as con:  # six failed trajectories that no run labelled
        con.execute("DELETE FROM labels WHERE trajectory_id IN (SELECT id FROM trajectories "
                    "WHERE NOT success ORDER BY id LIMIT 6)")
        # a capability labelled na everywhere: Cov 0 but ER- and ER+ undefined
        con.execute("INSERT INTO capabilities (name, description, source, status) "
                    "VALUES ('all_na', 'never applies', 'user', 'accepted')")
        con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                    "SELECT DISTINCT run_id, trajectory_id, 'all_na', 'na' FROM labels")
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    assert any(c.value.endswith("Undefined ratios are shown as —.") for c in at.caption)
    table = at.dataframe[0].value.set_index("capability")
    row = table.loc["all_na"]
    assert row["mean Delta"] == "—" and row["ER- 95% CI"] == "—" and row["Fisher p"] == "—"
    assert not table.isna().any().any()  # nothing the grid would draw as "None"
    view = wb.rankings(labeled, wb.RankConfig(), stability=wb.StabilityConfig())
    last = view.cover[-1]
    with store.connect(labeled, read_only=True) as con:
        n_failed = con.execute("SELECT count(*) FROM trajectories WHERE NOT success"
                               ).fetchone()[0]
    assert last["n_unlabelled"] == 6 and last["n_failed"] == n_failed - 6
    captions = " ".join(c.value for c in at.caption)
    assert (f"explains {last['covered']} of {last['n_failed']} labelled failed "
            "trajectories") in captions
    assert "6 more failed trajectories have no label for a kept capability" in captions
    sigs = {c["signature"]: c["n"] for c in view.clusters}
    assert sigs[wb.UNLABELLED] == 6


def test_first_visit_reads_the_stored_stability_and_an_edit_shows_progress(
        labeled: Path) -> None:
    """Issue 35: the label run's finish stored the default view's bootstrap resamples, so
    the first visit draws nothing and shows no progress; after an edit they are stale and
    the page draws them again inside a status box with a progress bar, then ranks the
    edited labels."""
    from trace_lib import store
    from trace_lib.workbench import diagnose as wb

    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception and not at.status
    with store.connect(labeled) as con:
        tid = con.execute("SELECT trajectory_id FROM label_pairs WHERE value = 'lacking' "
                          "ORDER BY ALL LIMIT 1").fetchall()[0][0]
        cap = con.execute("SELECT capability FROM label_pairs WHERE trajectory_id = ? AND "
                          "value = 'lacking' ORDER BY ALL LIMIT 1", [tid]).fetchall()[0][0]
    wb.edit_label(labeled, tid, cap, "present", editor="t")
    assert wb.rankings_state(labeled, None, wb.StabilityConfig()).pending
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    assert [(s.label, s.state) for s in at.status] == [
        ("Stability and failure clusters computed and stored", "complete")]
    view = wb.rankings(labeled, wb.RankConfig(), stability=wb.StabilityConfig())
    assert view.stability_source in ("stored", "memory")  # nothing drawn twice
    assert view.clusters_source == "stored"
    table = at.dataframe[0].value.set_index("capability")
    for r in view.ranking.rows:
        assert table.loc[r.capability, "runs passed"] == f"{r.n_runs_passed}/{r.n_runs_total}"
    at.slider(key="rho").set_value(0.2).run()  # a slider move: nothing pending any more
    assert not at.exception and not at.status
