"""The Routing page's demo section (Streamlit AppTest; issue 36): with nothing built it says
what the button does instead of an empty model picker; with a built demo (a real `tiny`
build) it opens on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "6_Routing.py")
HOME = str(Path(__file__).resolve().parents[2] / "app.py")


@pytest.fixture
def empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TRACE_ROUTING_DEMO_DIR", raising=False)  # under the models folder
    monkeypatch.setenv("TRACE_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "trace.duckdb"))
    return tmp_path


def test_with_nothing_built_the_page_says_what_the_button_does(empty: Path):
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    assert any("**Build the routing demo** trains two conflicting skills" in i.value
               for i in at.info)
    assert [b.label for b in at.button if b.key == "demo_build"] == ["Build the routing demo"]
    assert at.selectbox(key="demo_model").options == ["smollm2-135m", "tiny"]
    # no empty model picker: the sidebar says how to get a model
    assert "moe_pick" not in [s.key for s in at.sidebar.selectbox]
    assert any("No composed model yet" in c.value for c in at.sidebar.caption)
    assert not (empty / "trace.duckdb").exists()  # a view writes nothing


def test_home_has_the_same_build_controls(empty: Path):
    """One home for the picker and button (`page_parts.routing_demo_build`): Home shows the
    Routing page's controls under its own keys."""
    at = AppTest.from_file(HOME, default_timeout=120).run()
    assert not at.exception
    assert [b.label for b in at.button if b.key == "home_demo_build"] == [
        "Build the routing demo"]
    assert at.selectbox(key="home_demo_model").options == ["smollm2-135m", "tiny"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("routing_demo_page")
    mp = pytest.MonkeyPatch()
    mp.delenv("TRACE_ROUTING_DEMO_DIR", raising=False)
    mp.setenv("TRACE_MODELS_DIR", str(root / "models"))
    mp.setenv("TRACE_RUNS_DIR", str(root / "runs"))
    mp.setenv("TRACE_DB", str(root / "trace.duckdb"))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    from trace_lib.workbench import routing_demo

    routing_demo.build(root / "trace.duckdb", "tiny", progress=False)
    demo = routing_demo.find("tiny")
    torch.set_num_threads(previous)
    yield demo
    mp.undo()


def test_the_page_opens_on_the_built_demo(built: dict):
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    text = "\n".join(m.value for m in at.markdown)
    assert "**What you are seeing** (measured by the last build" in text
    assert built["what_you_see"].splitlines()[0] in text
    pick = at.selectbox(key="demo_example")
    assert len(pick.options) == 2
    assert f"**Request** ({built['examples'][0]['env']}, seed 20000)" in text
    assert f"**The router sends it to `{built['examples'][0]['routed_to']}`**" in text
    for policy in built["policies"]:
        assert f"**{policy}**" in text
    # the sidebar's picker opens on the demo's composed model
    assert at.sidebar.selectbox(key="moe_pick").value.startswith("moe ·")
    pick.set_value(pick.options[1]).run()
    text = "\n".join(m.value for m in at.markdown)
    assert f"**Request** ({built['examples'][1]['env']}, seed 20000)" in text


def test_home_shows_the_built_demo(built: dict):
    at = AppTest.from_file(HOME, default_timeout=120).run()
    assert not at.exception
    assert any(built["what_you_see"].splitlines()[0] in m.value for m in at.markdown)
