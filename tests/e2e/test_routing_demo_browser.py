"""The routing demo in a real browser (issue 36): `python -m trace_lib app` (what `make demo`
runs) and headless Chromium, the whole flow with `tiny`.

A fresh models folder and store: the Routing page says what the button does (no empty
model picker); picking `tiny` and clicking "Build the routing demo" starts the real
`routing_demo` job (SFT of two adapters, compose, warm start, export, the example
episodes), the page follows it and, once it ended, opens on the demo without a click: the
"what you are seeing" text with the build's figures, the example requests, where the
router sends each, the per-token colouring and the five policies' replies with their
verdicts. Home then quotes the build's first figure. Nothing shows a red error.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import choose_option  # noqa: E402

pytestmark = pytest.mark.e2e


def _selectbox(page, label: str):
    return page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').filter(
        has=page.get_by_text(label, exact=True))


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # the server (and the job it starts) inherit these
    monkeypatch.delenv("TRACE_ROUTING_DEMO_DIR", raising=False)  # under the models folder
    monkeypatch.setenv("TRACE_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def test_build_the_routing_demo_from_the_page(fresh: Path, db_path: Path, streamlit_server,
                                              browser_page, wait_for_app):
    from playwright.sync_api import expect

    page = browser_page
    server = streamlit_server(db_path)
    page.goto(server.url + "/Routing")
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=90_000)
    wait_for_app(page)
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text("Build the routing demo trains two conflicting skills",
                            exact=False)).to_be_visible()
    sidebar = page.locator('[data-testid="stSidebar"]')
    expect(sidebar.get_by_text("No composed model yet", exact=False)).to_be_visible()
    assert sidebar.get_by_text("(none yet)").count() == 0

    choose_option(page, _selectbox(page, "Base model"), "tiny")
    wait_for_app(page)
    main.get_by_role("button", name="Build the routing demo").click()
    # the job runs; the page follows it and reruns when it ended
    demo_box = page.locator(".st-key-routing_demo")
    expect(demo_box.get_by_text("What you are seeing", exact=False)).to_be_visible(
        timeout=300_000)
    wait_for_app(page)

    folder = fresh / "models" / "routing-demo" / "tiny"
    demo = json.loads((folder / "demo.json").read_text())
    runs = [p for p in (fresh / "runs").iterdir() if p.name.startswith("routing_demo")]
    assert len(runs) == 1  # built by the job the button started
    assert json.loads((runs[0] / "status.json").read_text())["state"] == "succeeded"

    # the build's figures, not hard-coded ones
    expect(demo_box.get_by_text(demo["what_you_see"].splitlines()[0], exact=False)
           ).to_be_visible()
    expect(demo_box.get_by_text("linear merge: passed", exact=False)).to_be_visible()
    first = demo["examples"][0]
    expect(demo_box.get_by_text(f"The router sends it to {first['routed_to']}",
                                exact=False)).to_be_visible()
    expect(demo_box.get_by_text(f"seed {first['seed']}", exact=False).first).to_be_visible()
    # per-token colouring: token spans in the routed colours, from the request on
    tokens = demo_box.locator("div.trace-tokens span")
    assert tokens.count() > 10
    expect(demo_box.locator("div.trace-tokens em").first).to_contain_text(
        "tokens of system prompt and tools not shown")
    # side by side: base, each adapter, the merge, the composed model, each with a verdict
    for i, policy in enumerate(demo["policies"]):
        box = page.locator(f".st-key-demo_reply_{i}")
        expect(box.get_by_text(policy, exact=True)).to_be_visible()
        reply = demo["examples"][0]["replies"][policy]
        expect(box.get_by_text(f"reward {reply['reward']:.2f}", exact=False)).to_be_visible()
    # the other environment's request
    second = demo["examples"][1]
    choose_option(page, _selectbox(page, "Example request (held-out seed)"),
                  f"{second['capability']} · seed {second['seed']} · "
                  f"{second['request'][:70]}…")
    wait_for_app(page)
    expect(demo_box.get_by_text(f"({second['env']}, seed {second['seed']})",
                                exact=False)).to_be_visible()
    # the sidebar opens on the demo's composed model
    expect(sidebar.get_by_role("combobox", name="Model")).to_have_value(
        re.compile(r"^moe · trajectory · 2 experts"))
    assert page.locator('[data-testid="stException"]').count() == 0

    page.goto(server.url + "/")
    wait_for_app(page)
    expect(page.locator(".st-key-home_routing_demo").get_by_text(
        demo["what_you_see"].splitlines()[0], exact=False)).to_be_visible()
    assert page.locator('[data-testid="stException"]').count() == 0
    assert server.tracebacks() == []
