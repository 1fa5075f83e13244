"""The whole journey, as a new user takes it, in one real headless Chromium session.

`make demo` (the CLI, on a fresh store) -> the app: import a real tau2-bench results file
through the upload widget -> label offline -> correct a label -> the ranking moves ->
export the selection -> open and play an environment -> validate and approve it -> launch a
short adapter training -> watch it finish -> compose -> per-token routing.

Every page visited leaves a screenshot in `artifacts/journey/` (CI keeps them). State the
journey does not need the UI for is never set up behind its back: each stage's input is
what the previous stage produced in the browser.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import (  # noqa: E402
    GRID_ID_COLUMNS,
    edit_grid_cell,
    fill_number,
    goto,
    pick_option,
    run_cli,
    screenshot,
    shot_dir,
    wait_until,
)

TAU2_FILE = "tau2-bench/results/feature-gym/gpt-4.1_airline_default_gpt-4.1_1trials.json"
ENV_NAME = "airline/precondition_verification"
DEMO_N = 48


@pytest.mark.e2e
@pytest.mark.slow
def test_new_user_journey(streamlit_server, browser_page, wait_for_app, db_path: Path,
                          tmp_path: Path, shared_data: Path, monkeypatch) -> None:
    from playwright.sync_api import expect

    from trace_lib import store
    from trace_lib.diagnose import capabilities as capmod
    from trace_lib.diagnose import labels as lb
    from trace_lib.diagnose.ranking import rank
    from trace_lib.envs import is_approved
    from trace_lib.workbench import training as records

    expect.set_options(timeout=30_000)  # 2 shared cores: reruns can take seconds
    shots = shot_dir("journey")
    runs = tmp_path / "runs"
    monkeypatch.setenv("TRACE_RUNS_DIR", str(runs))  # the app and its jobs inherit it

    # ---- 0. `make demo` on a fresh machine: the demo store, then the app.
    run_cli("demo", "build", "--if-absent", "--n", str(DEMO_N), "--out",
            str(tmp_path / "demo"), db=db_path)
    server = streamlit_server(db_path)
    page = browser_page
    goto(page, server.url, wait_for_app)
    expect(page.get_by_test_id("stMetric").filter(has_text="trajectories").first
           ).to_contain_text(str(DEMO_N))
    screenshot(page, shots, "00_home")

    # ---- 1. Trajectories: import a real tau2 results file through the upload widget.
    page.get_by_role("link", name="Trajectories →", exact=True).click()
    page.wait_for_url("**/Trajectories")
    wait_for_app(page)
    sidebar = page.get_by_test_id("stSidebar")
    uploader = sidebar.get_by_test_id("stFileUploader")
    if not uploader.is_visible():  # the expander starts open only on an empty store
        sidebar.get_by_test_id("stExpander").filter(has_text="Upload").locator("summary").click()
    expect(uploader).to_be_visible()
    uploader.locator("input[type=file]").set_input_files(str(shared_data / TAU2_FILE))
    # the widget shortens long names; its remove button carries the full one
    expect(sidebar.get_by_role("button", name=f"Remove {Path(TAU2_FILE).name}")).to_be_visible()
    wait_for_app(page)
    import_button = sidebar.get_by_role("button", name="Import", exact=True)
    expect(import_button).to_be_enabled()
    import_button.click()
    wait_for_app(page)

    def n_trajectories() -> int:
        with store.connect(db_path, read_only=True) as con:
            return con.execute("SELECT count(*) FROM trajectories").fetchone()[0]

    wait_until(lambda: n_trajectories() == DEMO_N + 20, 90, "the 20 tau2 trajectories")
    with store.connect(db_path, read_only=True) as con:
        formats = dict(con.execute("SELECT format, count(*) FROM datasets GROUP BY 1"
                                   ).fetchall())
    assert formats.get("tau2") == 1
    # the import runs before the page's queries, so the same run already counts it
    expect(page.get_by_test_id("stMetric").first).to_contain_text(str(DEMO_N + 20),
                                                                 timeout=60_000)
    screenshot(page, shots, "01_trajectories")

    # ---- 2. Labels: label offline, then correct one label in the grid.
    goto(page, server.url + "/Labels", wait_for_app)
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_role("button", name="Label all trajectories").click()
    wait_for_app(page)
    expect(page.get_by_test_id("stAlertContentSuccess").filter(has_text="failed")
           ).to_be_visible(timeout=120_000)  # "<run>: N labels, 0 failed"
    wait_for_app(page)
    all_caps = [c.name for c in capmod.list_capabilities(db_path) if c.status != "rejected"]
    shown = [c for c in capmod.CORE if c in all_caps] or all_caps
    grid_before = lb.label_grid(db_path, lb.LabelFilter(capabilities=shown))
    first_cap = grid_before.columns[GRID_ID_COLUMNS]
    current = grid_before.iloc[0][first_cap]
    corrected = "present" if current == "lacking" else "lacking"
    before = {r.capability: r for r in rank(db_path).rows}
    grid = page.get_by_test_id("stDataFrame").first
    expect(grid).to_be_visible()
    edit_grid_cell(page, grid, row=0, col=GRID_ID_COLUMNS, value=corrected)
    wait_for_app(page)
    with store.connect(db_path, read_only=True) as con:
        edits = con.execute("SELECT trajectory_id, capability, old, new FROM label_edits"
                            ).fetchall()
    assert edits == [(grid_before.iloc[0]["trajectory_id"], first_cap, current, corrected)]
    screenshot(page, shots, "02_labels")

    # ---- 3. Rankings: the edit moved the pooled counts; export the kept set.
    after = {r.capability: r for r in rank(db_path).rows}
    assert after[first_cap].pooled != before[first_cap].pooled
    goto(page, server.url + "/Rankings", wait_for_app)
    expect(page.get_by_test_id("stMetric").first).to_contain_text("Kept capabilities")
    export = page.get_by_role("button", name="Export selected_capabilities.json")
    selected = {r.capability for r in rank(db_path).selected}
    if selected:
        with page.expect_download() as dl:
            export.click()
        saved = tmp_path / "selected_capabilities.json"
        dl.value.save_as(saved)
        doc = json.loads(saved.read_text())
        assert {d["skill"] for d in doc} == selected
        assert {"skill", "mean_cov", "mean_delta", "n_runs_passed"} <= set(doc[0])
    else:  # one offline run on a small store can keep nothing: export is then disabled
        expect(export).to_be_disabled()
    screenshot(page, shots, "03_rankings")

    # ---- 4. Environments: open one, play it to the end, validate, approve.
    goto(page, server.url + "/Environments", wait_for_app)
    pick_option(page, "Environment", ENV_NAME, wait_for_app)
    expect(page.get_by_text("capability precondition_verification · domain airline")
           ).to_be_visible()
    page.get_by_role("tab", name="Instance").click()
    expect(page.get_by_text("User request")).to_be_visible()
    page.get_by_role("tab", name="Play").click()
    reward = page.get_by_test_id("stMetric").filter(has_text="Reward")
    step = page.get_by_role("button", name="Reference step")
    for i in range(12):  # the reference policy one action at a time, until the episode ends
        if reward.count() or step.is_disabled():
            break
        step.click()
        expect(page.get_by_text(f"[{i + 1}] {{").filter(visible=True).first).to_be_visible()
        wait_for_app(page)
        page.wait_for_timeout(500)  # the rest of the rerun (reward, disabled button) lands
    expect(page.get_by_test_id("stMetric").filter(has_text="Reward")).to_contain_text("1.000")
    screenshot(page, shots, "04_environments_play")
    page.get_by_role("tab", name="Validation").click()
    seeds = page.get_by_test_id("stTabs").get_by_label("Seeds", exact=True).first  # Validation tab
    seeds.fill("6")
    seeds.press("Enter")
    wait_for_app(page)
    page.get_by_role("button", name="Validate", exact=True).click()
    wait_for_app(page)
    expect(page.get_by_test_id("stMetric").filter(has_text="Validation")
           ).to_contain_text("validated", timeout=120_000)
    wait_for_app(page)
    page.get_by_role("tab", name="Review").click()
    approve = page.get_by_role("button", name="Approve", exact=True)
    expect(approve).to_be_enabled()
    approve.click()
    expect(page.get_by_text("status approved").filter(visible=True).first).to_be_visible()
    wait_for_app(page)
    screenshot(page, shots, "04_environments_review")
    assert is_approved(ENV_NAME, db=db_path)
    screenshot(page, shots, "04_environments")

    # ---- 5. Training: a short GRPO run on the approved environment, watched to the end.
    # the built-in tiny model's 16k context holds the prompt (no model of its own here)
    goto(page, server.url + "/Training", wait_for_app)
    pick_option(page, "Model", "tiny", wait_for_app)
    for label, value in (("Steps", 2), ("Group size G", 2), ("Seeds per step", 1),
                         ("Max turns", 1), ("Max tokens / turn", 4),
                         ("Held-out seeds (before/after)", 0), ("LoRA rank", 4),
                         ("LoRA targets", "q_proj,v_proj"), ("Checkpoint every N steps", 1)):
        fill_number(page, label, value)
    # the approved environment is the only one offered, so it is already chosen
    expect(page.get_by_role("combobox", name="Environment")).to_have_value(ENV_NAME)
    page.get_by_role("button", name="Launch").click()
    expect(page.get_by_text("Launched job")).to_be_visible(timeout=60_000)
    # The live panel re-reads the run directory every 2 s until the job ends.
    expect(page.get_by_text("2/2 steps")).to_be_visible(timeout=300_000)
    expect(page.get_by_test_id("stMetric").filter(has_text="State")
           ).to_contain_text("succeeded", timeout=120_000)
    # the fragment then reruns the whole page, which records the job's adapter
    adapters = wait_until(lambda: records.list_adapters(db_path), 60, "the adapter row")
    wait_for_app(page)
    assert len(adapters) == 1 and adapters[0]["environment"] == ENV_NAME
    assert (Path(adapters[0]["path"]) / "adapter_config.json").is_file()
    expect(page.get_by_text(adapters[0]["id"]).first).to_be_attached()  # a grid cell
    screenshot(page, shots, "05_training")

    # ---- 6. Routing: compose the trained adapter, route a prompt, see per-token routing.
    goto(page, server.url + "/Routing", wait_for_app)
    page.get_by_role("tab", name="Compose").click()
    page.get_by_test_id("stMultiSelect").filter(has_text="Trained adapters").click()
    page.get_by_role("option").filter(has_text=adapters[0]["id"]).first.click()
    page.keyboard.press("Escape")
    fill_number(page, "Output folder (under the runs directory by default)", tmp_path / "moe")
    page.get_by_role("button", name="Compose").click()
    wait_for_app(page)
    expect(page.get_by_text("gate parameters")).to_be_visible(timeout=120_000)
    assert (tmp_path / "moe" / "gates.safetensors").is_file()
    goto(page, server.url + "/Routing", wait_for_app)  # a fresh visit picks the new model
    page.get_by_role("tab", name="Route").click()
    fill_number(page, "Max new tokens", 6, wait_for_app)
    page.get_by_role("button", name="Route", exact=True).click()
    wait_for_app(page)
    tokens = page.locator(".trace-tokens").first
    expect(tokens).to_be_visible(timeout=120_000)
    assert tokens.locator("span").count() > 0
    # the legend names the slot by the adapter's capability, not its folder name
    expect(page.locator(".trace-legend").first).to_contain_text("1: precondition_verification")
    with store.connect(db_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM routing_traces").fetchone()[0] == 1
    screenshot(page, shots, "06_routing")
