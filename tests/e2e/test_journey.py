"""The whole journey, as a new user takes it, in one real headless Chromium session.

`make demo` (the CLI, on a fresh store) -> the app: import a real tau2-bench results file
through the upload widget -> label offline -> correct a label -> the ranking moves ->
export the selection -> scope Labels and Rankings to the imported dataset: label it, rank it,
export only its qualified examples -> open and play an environment -> validate and approve it -> launch a
short adapter training -> watch it finish -> compose -> per-token routing.

Every page visited leaves a screenshot in `artifacts/journey/` (CI keeps them). State the
journey does not need the UI for is never set up behind its back: each stage's input is
what the previous stage produced in the browser.

The server runs as `make demo` runs it (file watcher on), the Semantic clusters tab is
opened early (it loads the encoder, so `transformers`, in the server), and the journey
fails on any traceback in the server's log (issue 34: the watcher logged ~100 per action).
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import (  # noqa: E402
    GRID_ID_COLUMNS,
    choose_option,
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


def choose_scope(page, dataset: str, wait_for_app) -> None:
    """Pick `dataset` in the sidebar's scope picker (Labels and Rankings share it)."""
    picker = page.get_by_test_id("stSidebar").get_by_test_id("stMultiSelect").filter(
        has_text="Datasets")
    choose_option(page, picker.get_by_role("combobox"), dataset)
    page.keyboard.press("Escape")
    wait_for_app(page)


@pytest.mark.e2e
@pytest.mark.slow
def test_new_user_journey(streamlit_server, browser_page, wait_for_app, db_path: Path,
                          tmp_path: Path, shared_data: Path, monkeypatch) -> None:
    from playwright.sync_api import expect

    from trace_lib import store
    from trace_lib.diagnose import capability_curation as capmod
    from trace_lib.diagnose import labels as lb
    from trace_lib.diagnose.ranking import rank
    from trace_lib.envs import is_approved
    from trace_lib.workbench import diagnose as wb_diagnose
    from trace_lib.workbench import training as records

    shots = shot_dir("journey")
    runs = tmp_path / "runs"
    monkeypatch.setenv("TRACE_RUNS_DIR", str(runs))  # the app and its jobs inherit it

    # ---- 0. `make demo` on a fresh machine: the demo store, then the app.
    run_cli("demo", "build", "--if-absent", "--n", str(DEMO_N), "--out",
            str(tmp_path / "demo"), db=db_path)
    server = streamlit_server(db_path, watch=True)
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
    # The encoder loads in the background from here on: every later action runs with
    # transformers' lazy modules in the server's sys.modules.
    page.get_by_role("tab", name="Semantic clusters", exact=True).click()
    wait_for_app(page)
    expect(page.get_by_text("Failures only", exact=True)).to_be_visible()

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

    def label_edits() -> list:
        with store.connect(db_path, read_only=True) as con:
            return con.execute("SELECT trajectory_id, capability, old, new FROM label_edits"
                               ).fetchall()

    # the grid commits the edit on its own rerun, which can start after the wait above
    screenshot(page, shots, "02_labels_edited")
    edits = wait_until(label_edits, 90, "the grid edit in label_edits")
    assert edits == [(grid_before.iloc[0]["trajectory_id"], first_cap, current, corrected)]
    screenshot(page, shots, "02_labels")

    # ---- 3. Rankings: the edit moved the pooled counts; export the kept set.
    after = {r.capability: r for r in rank(db_path).rows}
    assert after[first_cap].pooled != before[first_cap].pooled
    goto(page, server.url + "/Rankings", wait_for_app)
    expect(page.get_by_test_id("stMetric").first).to_contain_text("Kept capabilities")
    export = page.get_by_role("button", name="Export selected_capabilities.json")
    # The page ranks K-of-N with its default stability (auto: bootstrap resamples when the
    # one offline run cannot vary); its export is what it shows as kept.
    selected = {d["skill"] for d in wb_diagnose.rankings(
        db_path, wb_diagnose.RankConfig(), details=False,
        stability=wb_diagnose.StabilityConfig()).document}
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

    # ---- 3b. Scope -> label -> rank -> export over the imported dataset only.
    theirs = Path(TAU2_FILE).name  # a dataset is named after its file
    with store.connect(db_path, read_only=True) as con:
        their_ids = {r[0] for r in con.execute(
            "SELECT t.id FROM trajectories t JOIN datasets d ON d.id = t.dataset_id "
            "WHERE d.name = ?", [theirs]).fetchall()}
        runs_before = {r[0] for r in con.execute("SELECT id FROM label_runs").fetchall()}
    assert len(their_ids) == 20
    goto(page, server.url + "/Labels", wait_for_app)
    choose_scope(page, theirs, wait_for_app)
    label_scoped = page.get_by_test_id("stSidebar").get_by_role(
        "button", name="Label the trajectories in scope", exact=True)
    expect(label_scoped).to_be_visible(timeout=60_000)  # the scope reached the page
    label_scoped.click()
    wait_for_app(page)
    expect(page.get_by_test_id("stAlertContentSuccess").filter(has_text="failed")
           ).to_be_visible(timeout=120_000)
    wait_for_app(page)
    with store.connect(db_path, read_only=True) as con:
        [new_run] = {r[0] for r in con.execute("SELECT id FROM label_runs").fetchall()
                     } - runs_before
        labeled = {r[0] for r in con.execute(
            "SELECT DISTINCT trajectory_id FROM labels WHERE run_id = ?", [new_run]
        ).fetchall()}
    assert labeled == their_ids  # the scoped run labeled that dataset, nothing else
    page.get_by_role("tab", name="Import / export", exact=True).click()
    csv_button = page.get_by_role(
        "button", name=f"Export effective labels (CSV) · dataset {theirs}", exact=True)
    with page.expect_download() as dl:
        csv_button.click()
    saved = tmp_path / "labels_scoped.csv"
    dl.value.save_as(saved)
    with open(saved, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and {r["dataset"] for r in rows} == {theirs}
    assert {r["trajectory_id"] for r in rows} == their_ids
    screenshot(page, shots, "03b_labels_scoped")

    goto(page, server.url + "/Rankings", wait_for_app)
    choose_scope(page, theirs, wait_for_app)
    main = page.get_by_test_id("stMain")
    expect(main.get_by_text(f"Scope: dataset {theirs}", exact=True)).to_be_visible(
        timeout=120_000)
    # what the page ranks with its defaults (rho 0.10, delta 0.20, K 8, every run, B 200)
    scoped = wb_diagnose.rankings(
        db_path, wb_diagnose.RankConfig(rho=0.10, delta=0.20, k=8), details=False,
        stability=wb_diagnose.StabilityConfig(method="auto", b=200),
        scope=wb_diagnose.Scope(datasets=(theirs,)))
    kept_there = {d["skill"] for d in scoped.document}
    assert kept_there, "the scoped ranking keeps nothing: no examples to check"
    expect(main.get_by_test_id("stMetric").filter(has_text="Kept capabilities")
           ).to_contain_text(f"{len(kept_there)} of {len(scoped.ranking.rows)}",
                             timeout=60_000)
    # The metric is drawn before the export button: let the rerun finish, or the click
    # downloads the previous (unscoped) render's document.
    wait_for_app(page)
    export = page.get_by_role("button", name="Export selected_capabilities.json",
                              exact=True)
    expect(export).to_be_enabled()
    with page.expect_download() as dl:
        export.click()
    saved = tmp_path / "selected_scoped.json"
    dl.value.save_as(saved)
    doc = json.loads(saved.read_text())
    assert {d["skill"] for d in doc} == kept_there
    examples = [e for d in doc for e in d["example_failed_trajectories"]]
    assert examples, doc
    assert {e["dataset"] for e in examples} == {theirs}
    assert {e["trajectory_id"] for e in examples} <= their_ids
    assert all(c.startswith(f"{theirs}/task ") for d in doc for c in d["example_failed_cases"])
    screenshot(page, shots, "03b_rankings_scoped")

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
    choose_option(page, page.get_by_test_id("stMultiSelect").filter(
        has_text="Trained adapters"), re.compile(re.escape(adapters[0]["id"])))
    page.keyboard.press("Escape")
    fill_number(page, "Output folder (under the runs directory by default)", tmp_path / "moe")
    page.get_by_role("button", name="Compose").click()
    wait_for_app(page)
    # the Compose result, not the model summary that also counts gate parameters
    expect(page.get_by_text(re.compile(r"^composed \d+ experts?, \d+ gate parameters"))
           ).to_be_visible(timeout=120_000)
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

    # ---- 7. A quiet server: the whole walk logged no traceback.
    assert server.tracebacks() == []
