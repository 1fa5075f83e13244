"""Environments page (Streamlit AppTest): inspect, play, validate, calibrate, approve,
generate, on a real DuckDB file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib.envs import catalog, is_approved

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "4_Environments.py")
NAME = "airline/precondition_verification"


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "envs.duckdb"
    monkeypatch.setenv("TRACE_DB", str(path))
    return path


def _open(name: str = NAME) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception, at.exception
    at.selectbox(key="env_name").set_value(name).run()
    assert not at.exception, at.exception
    return at


def test_list_code_schemas_and_instance(db: Path) -> None:
    at = _open()
    table = at.dataframe[0].value
    assert len(table) >= 8 and set(table["status"]) == {"draft"}
    assert any("Built-in task builders" in c.value for c in at.caption)
    assert any("def airline_cancel" in c.value for c in at.code)
    assert any("Identical to the airline domain" in s.value for s in at.success)
    request = at.text[0].value
    assert request.startswith("Hi, I'm user ")
    at.number_input(key="seed").set_value(5).run()
    assert at.text[0].value != request
    at.toggle(key="show_truth").set_value(True).run()
    truth = at.json[-1].value
    assert "reference_actions" in json.loads(truth) if isinstance(truth, str) else truth


def test_play_by_hand_and_by_reference(db: Path) -> None:
    at = _open()
    at.text_area(key="action").set_value('{"name": "list_all_airports", "arguments": {}}')
    at.button(key="send").click().run()
    assert not at.exception
    assert any('"iata"' in c.value for c in at.code)
    at.button(key="restart").click().run()
    for _ in range(6):
        if at.button(key="ref_step").disabled:
            break
        at.button(key="ref_step").click().run()
    reward = [m for m in at.metric if m.label == "Reward"]
    assert reward and reward[0].value == "1.000"
    assert any("database matches the expected state" in t.value for t in at.text)


def test_validate_then_approve_then_reject(db: Path) -> None:
    at = _open()
    assert at.button(key="approve").disabled
    at.number_input(key="val_seeds").set_value(6).run()
    at.button(key="validate").click().run()
    assert not at.exception, at.exception
    assert catalog.get_row(NAME, db=db)["status"] == "validated"
    assert any(m.label == "Validation" and m.value == "validated" for m in at.metric)
    at.text_input(key="review_note").set_value("checked by hand")
    at.button(key="approve").click().run()
    assert is_approved(NAME, db=db)
    assert catalog.get_row(NAME, db=db)["report"]["review"]["note"] == "checked by hand"
    at.button(key="reject").click().run()
    assert not is_approved(NAME, db=db)


def test_calibration_charts(db: Path) -> None:
    at = _open()
    at.number_input(key="cal_seeds").set_value(3)
    at.number_input(key="cal_group").set_value(4)
    calibrate = next(b for b in at.button if b.label == "Calibrate")
    calibrate.click().run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == 3
    stored = catalog.get_row(NAME, db=db)["report"]["calibration"]
    assert stored["config"]["group"] == 4 and "pass@4" in stored


def test_generate_with_the_template_generator(db: Path) -> None:
    at = AppTest.from_file(PAGE, default_timeout=180).run()
    at.selectbox(key="gen_cap").set_value("structured_data_reasoning")
    at.selectbox(key="gen_domain").set_value("retail")
    at.number_input(key="gen_seeds").set_value(5)
    generate = next(b for b in at.button if b.label == "Generate and validate")
    generate.click().run()
    assert not at.exception, at.exception
    name = "retail/structured_data_reasoning/gen1"
    assert catalog.get_row(name, db=db)["status"] == "validated"
    assert at.selectbox(key="env_name").value == name
    assert any("TEMPLATE generator" in c.value for c in at.code)
    at.session_state["live_env"]["env"].close()  # the sandbox worker of the generated env
