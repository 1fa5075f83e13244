"""Every page action and its CLI verb call the same use-case function.

For each action the use case is replaced, on its `trace_lib.workbench` module, by a
recorder that notes the call and stops there; then the page (streamlit's AppTest, the
real page script) and the CLI (`cli.main([...])`) are each driven to that action. Both
must reach the recorder: a front end that re-orchestrates the action itself (the drift
issue 11 is about) never calls it and fails here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib import cli, jobs, store
from trace_lib.envs.catalog import save_environment
from trace_lib.envs.registry import EnvSpec
from trace_lib.workbench import composition, data, diagnose, environments
from trace_lib.workbench import jobs as wb_jobs

PAGES = Path(__file__).resolve().parents[2] / "pages"
BUILTIN = "airline/precondition_verification"
TOY_ENV = "trace_lib.train.smoke_envs:TargetLetterEnv"


class Called(Exception):
    """Raised by a recorder: the use case was reached; nothing past it runs."""


class Recorder:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, module, name: str) -> None:
        self.calls: list[tuple[tuple, dict]] = []
        self.where = f"{module.__name__}.{name}"
        monkeypatch.setattr(module, name, self)

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        raise Called(self.where)

    def take(self) -> tuple[tuple, dict]:
        assert self.calls, f"{self.where} was not called"
        return self.calls.pop()


@pytest.fixture
def env_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real store file the pages read through TRACE_DB, and a private runs folder."""
    db = tmp_path / "trace.duckdb"
    with store.connect(db):
        pass
    monkeypatch.setenv("TRACE_DB", str(db))
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    return db


def page(name: str, timeout: int = 120, **state) -> AppTest:
    """A page after its first run; `state` is set in session state first (e.g. a lazy
    tab's key to open that tab)."""
    at = AppTest.from_file(str(PAGES / name), default_timeout=timeout)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def run_cli(argv: list[str]) -> None:
    with pytest.raises(Called):
        cli.main(argv)


# ------------------------------------------------------------------------------- data


def test_import(env_db, tmp_path, monkeypatch):
    rec = Recorder(monkeypatch, data, "import_files")
    at = page("1_Trajectories.py")
    at.sidebar.get("file_uploader")[0].upload("runs.jsonl", b"{}\n").run()
    at.button(key="upload_go").click().run()
    sources = rec.take()[0][0]
    assert [s.name for s in sources] == ["runs.jsonl"]
    path = tmp_path / "runs.jsonl"
    path.write_text("{}\n")
    run_cli(["ingest", str(path), "--db", str(env_db)])
    assert rec.take()[0][0] == [str(path)]


# --------------------------------------------------------------------------- diagnose


@pytest.fixture
def labeled_db(env_db, tmp_path) -> tuple[Path, str]:
    """The demo store with two label runs that disagree on one pair (a review queue)."""
    data.build_demo(tmp_path / "demo", n=6, db=env_db)
    with store.connect(env_db) as con:
        tid = con.execute("SELECT id FROM trajectories ORDER BY id LIMIT 1").fetchone()[0]
    for run, value in (("r1", "present"), ("r2", "lacking")):
        csv = tmp_path / f"{run}.csv"
        csv.write_text(f"trajectory_id,capability,value\n{tid},precondition_verification,"
                       f"{value}\n")
        diagnose.import_labels(env_db, csv, run)
    return env_db, tid


def test_label(env_db, monkeypatch):
    rec = Recorder(monkeypatch, diagnose, "label")
    at = page("2_Labels.py")
    at.button(key="run_labeler").click().run()
    assert rec.take()[0][1] == "heuristic"
    run_cli(["label", "--db", str(env_db)])
    assert rec.take()[0][1] == "heuristic"


def test_edit_label(labeled_db, monkeypatch):
    db, tid = labeled_db
    rec = Recorder(monkeypatch, diagnose, "edit_label")
    at = page("2_Labels.py", labels_tab="Review queue")
    at.selectbox(key="q_value").set_value("na")
    at.button(key="q_go").click().run()
    assert rec.take()[0][1:] == (tid, "precondition_verification", "na")
    run_cli(["labels", "edit", tid, "precondition_verification", "na", "--db", str(db)])
    assert rec.take()[0][1:] == (tid, "precondition_verification", "na")


def test_rank_and_export(labeled_db, tmp_path, monkeypatch):
    db, _ = labeled_db
    rec = Recorder(monkeypatch, diagnose, "rankings")
    page("3_Rankings.py")
    assert rec.take()[0][1].runs == ["r1", "r2"]
    run_cli(["rank", "--db", str(db), "--export", str(tmp_path / "sel.json")])
    assert rec.take()[0][1].k == 8


# ---------------------------------------------------------------------- environments


def test_env_validate(env_db, monkeypatch):
    rec = Recorder(monkeypatch, environments, "validate")
    at = page("4_Environments.py")
    at.selectbox(key="env_name").set_value(BUILTIN).run()
    at.button(key="validate").click().run()
    assert rec.take()[0][0] == BUILTIN
    run_cli(["env", "validate", BUILTIN, "--db", str(env_db)])
    assert rec.take()[0][0] == BUILTIN


def test_env_approve(env_db, monkeypatch):
    spec = environments.resolve(BUILTIN)
    save_environment(spec, status="validated", db=env_db)
    rec = Recorder(monkeypatch, environments, "approve")
    at = page("4_Environments.py")
    at.selectbox(key="env_name").set_value(BUILTIN).run()
    at.button(key="approve").click().run()
    assert rec.take()[0][0] == BUILTIN
    run_cli(["env", "approve", BUILTIN, "--db", str(env_db)])
    assert rec.take()[0][0] == BUILTIN


def test_env_generate(env_db, monkeypatch):
    rec = Recorder(monkeypatch, environments, "generate")
    at = page("4_Environments.py")
    at.selectbox(key="gen_cap").set_value("precondition_verification")
    next(b for b in at.button if b.label == "Generate and validate").click().run()
    assert rec.take()[0][:2] == ("precondition_verification", "airline")
    run_cli(["env", "generate", "precondition_verification", "--db", str(env_db)])
    assert rec.take()[0][:2] == ("precondition_verification", "airline")


# -------------------------------------------------------------------------- training


def test_train_launch(env_db, monkeypatch):
    save_environment(EnvSpec(name=TOY_ENV, capability="toy_target_letter", domain="toy",
                             version=1, source="file", code="# toy env lives in tests"),
                     status="approved", db=env_db)
    rec = Recorder(monkeypatch, wb_jobs, "submit_training")
    at = page("5_Training.py")
    at.selectbox(key="model").set_value("tiny")
    next(b for b in at.button if b.label == "Launch").click().run()
    page_config = rec.take()[0][1]
    run_cli(["train", "--env", TOY_ENV, "--background", "--db", str(env_db),
             "--eval-seeds", "16"])
    cli_config = rec.take()[0][1]
    # The same use case, and the same config for the same settings (built once).
    assert page_config == cli_config


def test_job_cancel(env_db, monkeypatch):
    spec = jobs.JobSpec(kind="train_adapter", config={"env": TOY_ENV, "steps": 5})
    spec.path.mkdir(parents=True)
    (spec.path / "spec.json").write_text(json.dumps(spec.to_dict()))
    # A running job whose process is this test's own (alive, and never signalled: the
    # recorder stands in for the cancel).
    jobs.update_status(spec.path, state="running", backend="local", kind=spec.kind,
                       pid=os.getpid())
    wb_jobs.record_job(env_db, spec)
    rec = Recorder(monkeypatch, wb_jobs, "cancel")
    at = page("5_Training.py")
    at.button(key=f"cancel_{spec.id}").click().run()
    assert rec.take()[0][1] == spec.id
    run_cli(["job", "cancel", spec.id, "--db", str(env_db)])
    assert rec.take()[0][1] == spec.id


# ----------------------------------------------------------------------- composition


def test_compose(env_db, tmp_path, monkeypatch):
    rec = Recorder(monkeypatch, composition, "compose")
    at = page("6_Routing.py")
    at.text_area(key="compose_extra").set_value("cap=/adapters/a")
    at.text_input(key="compose_out").set_value(str(tmp_path / "moe"))
    at.button(key="compose_go").click().run()
    assert rec.take()[0][2:4] == ("cap=/adapters/a", str(tmp_path / "moe"))
    run_cli(["compose", "--model", "tiny", "--adapters", "cap=/adapters/a", "--out",
             str(tmp_path / "moe"), "--db", str(env_db)])
    assert rec.take()[0][2:4] == ("cap=/adapters/a", str(tmp_path / "moe"))


def test_route(env_db, tmp_path, monkeypatch):
    # The page holds a loaded model; a stand-in with the attributes the page shows keeps
    # this test about the dispatch, not about loading weights.
    held = SimpleNamespace(slots=["base", "cap"], layers=2, hidden=8,
                           gate_param_count=lambda: 18, config=SimpleNamespace(mode="top1"))
    monkeypatch.setattr(composition, "load_moe", lambda path, mode=None: held)
    rec = Recorder(monkeypatch, composition, "route")
    at = page("6_Routing.py")
    at.text_input(key="moe_folder").set_value(str(tmp_path / "moe")).run()
    at.text_area(key="prompt").set_value("hello")
    at.button(key="route_go").click().run()
    args, kwargs = rec.take()
    assert args[2].kind == "prompt" and args[2].prompt == "hello"
    run_cli(["route", "--moe", str(tmp_path / "moe"), "--prompt", "hello", "--db",
             str(env_db)])
    args, kwargs = rec.take()
    assert args[2].kind == "prompt" and args[2].prompt == "hello"


# ------------------------------------------------------------------------------- loop


def test_loop_start(env_db, monkeypatch):
    from trace_lib.workbench import loop

    rec = Recorder(monkeypatch, loop, "start_background")
    at = page("8_Improve.py")
    at.multiselect(key="loop_caps").set_value(["tool_calling_precision"])
    at.number_input(key="loop_budget").set_value(0.0)
    at.button[0].click().run()
    cfg = rec.take()[0][1]
    assert (cfg.model, cfg.capabilities, cfg.budget_cpu_hours) == (
        "smollm2-135m", ["tool_calling_precision"], None)
    run_cli(["loop", "--model", "smollm2-135m", "--capabilities", "tool_calling_precision",
             "--background", "--db", str(env_db)])
    cfg = rec.take()[0][1]
    assert (cfg.model, cfg.capabilities) == ("smollm2-135m", ["tool_calling_precision"])
