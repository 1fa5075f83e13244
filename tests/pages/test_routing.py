"""Routing page (Streamlit AppTest) over a real composed tiny model and a real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from envs_fixture import write_file_env
from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "6_Routing.py")


def _adapter(base_dir: Path, out: Path, seed: int, capability: str) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    peft_model.save_pretrained(str(out))
    (out / "trace_adapter.json").write_text(json.dumps({"capability": capability}))
    return out


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The page runs a tiny model in-process; one thread avoids spinning on a busy CI box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def composed_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import load_file, save_file

    from trace_lib.compose.gated import compose
    from trace_lib.runtime.base_models import ensure_model_dir

    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # module fixtures run before the autouse one
    root = tmp_path_factory.mktemp("routing_page")
    tiny = ensure_model_dir("tiny")
    specs = [(None, _adapter(tiny, root / cap, i, cap))
             for i, cap in enumerate(["precondition_verification", "tool_calling_precision"])]
    compose(str(tiny), specs, out=root / "moe")
    gates = load_file(str(root / "moe" / "gates.safetensors"))
    g = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(v.shape, generator=g) * 2 for k, v in gates.items()},
              str(root / "moe" / "gates.safetensors"))
    torch.set_num_threads(previous)
    return root / "moe"


@pytest.fixture
def store_with_moe(composed_template: Path, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    from trace_lib.workbench.composition import register_moe

    db = tmp_path / "t.duckdb"
    monkeypatch.setenv("TRACE_DB", str(db))
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    register_moe(db, composed_template)
    return db, composed_template


def test_empty_store_explains_how_to_compose(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "none.duckdb"))
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    assert any("No composed model yet" in i.value for i in at.info)


def test_live_prompt_is_routed_escaped_and_indexed(store_with_moe) -> None:
    import duckdb

    db, moe_dir = store_with_moe
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    assert at.selectbox(key="moe_pick").value.startswith(f"{moe_dir.name} · ")
    assert at.text_input(key="moe_folder").value == ""  # the pick is used, no override
    at.text_area(key="prompt").set_value("<script>alert(1)</script> cancel ABC123")
    at.number_input(key="max_new").set_value(4)
    at.button(key="route_go").click().run()
    assert not at.exception
    htmls = [h.proto.body for h in at.get("html")]
    tokens = next(h for h in htmls if "trace-tokens" in h)
    assert "<script>" not in tokens and "&lt;" in tokens  # trajectory text is escaped
    assert any("precondition_verification" in h for h in htmls)  # the legend
    assert len(at.get("plotly_chart")) >= 4  # heatmap, share by role and turn, entropy
    con = duckdb.connect(str(db), read_only=True)
    n = con.execute("SELECT count(*) FROM routing_traces WHERE source = 'prompt'").fetchone()[0]
    con.close()
    assert n == 1
    # Force expert 2 and re-run beside the routed one.
    at.selectbox(key="force").set_value(2)
    at.button(key="force_go").click().run()
    assert not at.exception
    assert any("Forced: slot 2" in m.value for m in at.markdown)
    # Colour by one layer instead of the majority.
    at.selectbox(key="layer").set_value("layer 1").run()
    assert not at.exception


def test_compose_tab_writes_and_registers(store_with_moe, tmp_path: Path) -> None:
    db, moe_dir = store_with_moe
    meta = json.loads((moe_dir / "moe.json").read_text())
    paths = "\n".join(f"{a['name']}={moe_dir / a['path']}" for a in meta["adapters"])
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    # The default output folder is under the runs directory, not a relative data/moe.
    assert at.text_input(key="compose_out").value == str(tmp_path / "runs" / "composed"
                                                         / "moe-1")
    at.text_area(key="compose_extra").set_value(paths)
    at.text_input(key="compose_base").set_value("tiny")
    at.text_input(key="compose_out").set_value(str(tmp_path / "new_moe"))
    at.button(key="compose_go").click().run()
    assert not at.exception
    assert any("gate parameters" in s.value for s in at.success)
    assert (tmp_path / "new_moe" / "gates.safetensors").is_file()
    from trace_lib.workbench.composition import list_moe_models

    assert len(list_moe_models(db)) == 2
    # The Route tab uses the model just composed, without a reload.
    assert at.selectbox(key="moe_pick").value.startswith("new_moe · ")
    assert not any("No composed model yet" in i.value for i in at.info)



def test_gate_training_starts_as_a_background_job(store_with_moe) -> None:
    from trace_lib import jobs
    from trace_lib.workbench import environments

    db, _moe_dir = store_with_moe
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    at.number_input(key="warm_seeds").set_value(1)
    at.number_input(key="gate_steps").set_value(1)
    # Only approved environments train, gates included: nothing starts, the error says why.
    picked = at.multiselect(key="gate_envs").value
    at.button(key="gates_go").click().run()
    assert not at.exception
    assert any(f"'{picked[0]}' is draft" in e.value for e in at.error), picked
    assert not jobs.list_jobs()
    for name in picked:
        environments.approve(name, note="test", force=True, db=db)
    at.button(key="gates_go").click().run()
    assert not at.exception
    started = [s.value for s in at.success if s.value.startswith("started job")]
    assert started, [e.value for e in at.error]
    job_id = started[0].split()[2]
    try:
        spec = jobs.find_spec(job_id)
        assert spec.kind == "train_gates" and spec.config["warm_seeds"] == 1
        at.run()  # the job list shows it
        assert job_id in at.dataframe[0].value["id"].tolist()
    finally:
        status = jobs.cancel(job_id, grace_s=5)  # leave no process running
    assert status.state in ("cancelled", "failed", "succeeded")
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    kinds = [r[0] for r in con.execute("SELECT kind FROM jobs").fetchall()]
    con.close()
    assert kinds == ["train_gates"]

# ------------------------------------------------------------------ real browser
HOSTILE = '<img src=x onerror="window.__xss=1"> cancel ABC123'


@pytest.mark.e2e
def test_browser_routes_a_live_prompt_and_shows_escaped_tokens(store_with_moe,
                                                               tmp_path: Path) -> None:
    """`streamlit run` on a free port + Debian's Chromium: type a prompt, route it, hover a
    token, force an expert; the prompt's markup must show as text and never run."""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from playwright.sync_api import expect, sync_playwright

    db, _moe_dir = store_with_moe
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.fail(f"{chromium} is missing: install Debian's chromium (apt-get install chromium)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "streamlit.log"
    env = {**os.environ, "TRACE_DB": str(db), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", PAGE, "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true",
             "--server.fileWatcherType", "none"],
            cwd=str(Path(PAGE).parents[1]), env=env, stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"streamlit did not start:\n{log.read_text()[-2000:]}")
                time.sleep(0.3)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(chromium), headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.get_by_text("Prompt", exact=True).wait_for()
            prompt = page.get_by_label("Prompt", exact=True)
            prompt.fill(HOSTILE)
            prompt.press("Control+Enter")
            page.get_by_role("button", name="Route").click()
            tokens = page.locator(".trace-tokens span")
            tokens.first.wait_for()
            text = page.locator(".trace-tokens").first.inner_text()
            assert "<img" in text.replace("⏎", "\n")  # shown as text
            assert page.evaluate("() => window.__xss") is None  # and never run
            title = tokens.nth(3).get_attribute("title")
            assert title and "L0:" in title and "L1:" in title  # per-layer hover
            expect(page.get_by_test_id("stPlotlyChart").first).to_be_attached(timeout=60_000)
            page.get_by_role("button", name="Re-run forced").click()
            expect(page.get_by_text("Forced: slot 0")).to_be_visible(timeout=60_000)
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_gate_job_that_did_not_move_is_flagged(store_with_moe, tmp_path: Path) -> None:
    """A gate job whose groups all had the same reward cannot move the gates: the Train
    gates tab shows the movement metrics and says so (as `job status` does)."""
    from trace_lib import jobs
    from trace_lib.compose.gate_training import GateTrainConfig
    from trace_lib.workbench.jobs import submit_gates

    db, moe_dir = store_with_moe
    env_file = write_file_env(tmp_path, "toy/constant", reward="zero")
    cfg = GateTrainConfig(moe=str(moe_dir), envs=[str(env_file)], warm_seeds=0,
                          warm_steps=0, steps=1, group=2, groups_per_step=1, max_turns=1,
                          max_tokens=2, balance_coef=0.0, torch_threads=1)
    spec = submit_gates(db, cfg)
    status = jobs.wait(spec.id, timeout_s=300)
    assert status.state == "succeeded", jobs.read_log(spec.run_dir)
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    labels = {m.label: m.value for m in at.metric}
    assert labels.get("GRPO steps with signal") == "0/1"
    assert any("have not moved" in w.value and "no signal" in w.value for w in at.warning)
    assert labels.get("State") == "succeeded — no learning signal"


@pytest.mark.e2e
def test_browser_tokens_flow_inline_and_forcing_is_apart(store_with_moe, streamlit_server,
                                                         browser_page, wait_for_app,
                                                         tmp_path: Path) -> None:
    """A saved trace with 32 newline tokens in a row: they flow inline (one line break for
    the run, not one line each), and "force expert" sits in its own labelled box, apart
    from the Route controls."""
    import numpy as np
    from playwright.sync_api import expect

    from trace_lib.compose.traces import RoutingTrace
    from trace_lib.workbench import composition

    db, moe_dir = store_with_moe
    tokens = ["Hello", " there"] + ["\n"] * 32 + ["bye"]
    n, layers = len(tokens), 2
    slots = ["base", "a", "b"]
    probs = np.full((n, layers, len(slots)), 1 / len(slots), dtype=np.float32)
    trace = RoutingTrace(token_ids=list(range(n)), tokens=tokens, roles=["assistant"] * n,
                         turns=[1] * n, chosen=np.zeros((n, layers), dtype=np.int64),
                         probs=probs, slots=slots, prompt_len=0, meta={"source": "prompt"})
    composition.save_and_index(db, moe_dir, trace, "prompt")
    page = browser_page
    page.goto(streamlit_server(db, "pages/6_Routing.py").url)
    expect(page.get_by_role("heading", name="Routing", exact=True)).to_be_visible(timeout=120_000)
    wait_for_app(page)
    page.get_by_text("Saved trace", exact=True).click()
    wait_for_app(page)
    page.locator(".st-key-open_saved").get_by_role("button", name="Open").click()
    box = page.locator(".trace-tokens")
    expect(box).to_contain_text("bye", timeout=120_000)
    assert box.inner_text().count("⏎") == 32
    line = page.evaluate("() => parseFloat(getComputedStyle("
                         "document.querySelector('.trace-tokens')).lineHeight)")
    assert box.bounding_box()["height"] < 4 * line  # two lines, not 33
    force = page.locator(".st-key-force_box")
    expect(force).to_contain_text("Counterfactual: force one expert")
    expect(force.get_by_text("Force expert")).to_be_visible()
    expect(force.get_by_role("button", name="Route")).to_have_count(0)


@pytest.mark.e2e
def test_browser_gate_training_follows_the_job_without_refresh(
        store_with_moe, streamlit_server, browser_page, wait_for_app, tmp_path: Path) -> None:
    """A running gate job's panel follows its run directory (no Refresh button): a new GRPO
    row appears on the page by itself."""
    from playwright.sync_api import expect

    from trace_lib import jobs
    from trace_lib.jobs.run_dir import write_json_atomic

    db, moe_dir = store_with_moe
    spec = jobs.JobSpec(kind="train_gates", config={"moe": str(moe_dir), "envs": ["x"],
                                                     "steps": 3})
    spec.path.mkdir(parents=True)
    write_json_atomic(spec.path / "spec.json", spec.to_dict())
    jobs.update_status(spec.path, state="running", backend="local", kind="train_gates")

    def grpo_row(step: int) -> str:
        return json.dumps({"phase": "grpo", "step": step, "reward_mean": 0.5,
                           "routing_entropy": 0.7, "gate_norm": 0.1 * step,
                           "gate_delta": 0.1 * step, "groups_kept": 1, "share_base": 0.5,
                           "share_a": 0.5}) + "\n"

    (spec.path / "metrics.jsonl").write_text(grpo_row(1))
    page = browser_page
    page.goto(streamlit_server(db, "pages/6_Routing.py").url)
    expect(page.get_by_role("heading", name="Routing", exact=True)).to_be_visible(timeout=120_000)
    wait_for_app(page)
    page.get_by_role("tab", name="Train gates").click()
    signal = page.get_by_test_id("stMetric").filter(has_text="GRPO steps with signal")
    expect(signal).to_contain_text("1/1", timeout=120_000)
    expect(page.get_by_role("button", name="Refresh")).to_have_count(0)
    with (spec.path / "metrics.jsonl").open("a") as fh:
        fh.write(grpo_row(2))
    expect(signal).to_contain_text("2/2", timeout=60_000)


def test_picking_an_adapter_that_learned_nothing_warns(tmp_path: Path, monkeypatch) -> None:
    """Issue 34: the warning shows as soon as the adapter is picked, before Compose; an
    adapter whose run learned shows none."""
    from trace_lib.workbench.training import record_adapter

    db = tmp_path / "t.duckdb"
    monkeypatch.setenv("TRACE_DB", str(db))
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    for job, signal in (("train-quiet", [True, True]), ("train-good", [True, False])):
        run = tmp_path / "runs" / job
        (run / "adapter").mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i, "no_signal": q}) + "\n" for i, q in enumerate(signal)))
        record_adapter(db, {"capability": job.split("-")[1], "env": "airline/x",
                            "base_model": "tiny",
                            "adapter_path": str((run / "adapter").resolve())}, job)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception and not at.warning
    at.multiselect(key="compose_adapters").set_value(["good · a_train-good"]).run()
    assert not at.exception and not at.warning
    at.multiselect(key="compose_adapters").set_value(
        ["good · a_train-good", "quiet · a_train-quiet"]).run()
    assert not at.exception
    [warning] = at.warning
    assert "Adapter quiet" in warning.value and "no learning signal" in warning.value


def test_evaluate_tab_derives_tokens_per_turn_from_the_environments(store_with_moe) -> None:
    """Issue 30: the Evaluate tab had a fixed 32 tokens per turn (cut the reference call of
    airline's environments mid-JSON). Left at 0 it uses the one derived default, shows the
    number before the click (the same `reference_turn_budget` the run uses) and says which
    budget the saved evaluation used; the Train gates tab shows its own the same way."""
    from trace_lib.compose.gated import load_moe
    from trace_lib.train.local_rollouts import reference_turn_budget
    from trace_lib.workbench import composition
    from trace_lib.workbench.environments import open_environment

    db, moe_dir = store_with_moe
    env = "airline/tool_calling_precision"
    tokenizer = load_moe(str(moe_dir)).tokenizer
    with open_environment(env) as handle:
        expected = reference_turn_budget({env: lambda: handle}, tokenizer, max_turns=2)
    assert expected.longest_reference_turn > 32  # the old fixed 32 could not hold it
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    assert at.number_input(key="eval_tokens").value == 0
    assert at.number_input(key="gate_tokens").value == 0
    at.multiselect(key="eval_envs").set_value([env])
    at.multiselect(key="gate_envs").set_value([env]).run()
    assert not at.exception
    hints = [c.value for c in at.caption if "left at 0 uses" in c.value]
    assert len(hints) == 2, hints  # gates (2 turns) and evaluate (2 turns)
    assert all(f"uses {expected.max_tokens}:" in h and
               f"is {expected.longest_reference_turn} tokens" in h for h in hints), hints
    at.number_input(key="eval_seeds").set_value(1)
    try:
        at.button(key="eval_go").click().run(timeout=600)
        saved = composition.saved_eval(moe_dir)
    finally:  # the composed folder is the module's: leave it as the other tests found it
        (moe_dir / "eval.json").unlink(missing_ok=True)
    assert not at.exception
    assert saved["config"]["max_tokens"] == expected.max_tokens
    assert saved["config"]["turn_budget"]["longest_reference_turn"] == \
        expected.longest_reference_turn
    assert any(f"Evaluated with {expected.max_tokens} tokens per turn" in c.value
               and "derived from the environments" in c.value for c in at.caption)
