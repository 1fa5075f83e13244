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
    kept_lib = {r.capability for r in rank(labeled).selected}
    assert set(table.loc[table["kept"], "capability"]) == kept_lib and kept_lib
    assert "K scaled" in at.info[0].value or "scaled" in at.info[0].value
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
