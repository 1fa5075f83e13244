"""Environment use cases on a real store: the generation request every front end sends,
the validation report and the keep-approval rule, review, and one name resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib import cli, store
from trace_lib.envs import generate as generate_mod
from trace_lib.envs.catalog import get_row, save_environment
from trace_lib.errors import UserInputError
from trace_lib.workbench import data, diagnose, environments

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "4_Environments.py")
CAP = "precondition_verification"
BUILTIN = f"airline/{CAP}"


@pytest.fixture
def store_with_examples(tmp_path, monkeypatch) -> tuple[Path, list[str]]:
    """The demo store; the capability lists two failed trajectories as its examples."""
    db = tmp_path / "trace.duckdb"
    monkeypatch.setenv("TRACE_DB", str(db))
    data.build_demo(tmp_path / "demo", n=6, db=db)
    diagnose.list_capabilities(db)  # seeds the built-in menu
    with store.connect(db) as con:
        ids = [r[0] for r in con.execute(
            "SELECT id FROM trajectories WHERE NOT success ORDER BY id LIMIT 2").fetchall()]
        con.execute("UPDATE capabilities SET examples = ? WHERE name = ?",
                    [json.dumps(ids), CAP])
    return db, ids


class Stop(Exception):
    pass


def test_page_and_cli_send_the_same_generation_request(store_with_examples, monkeypatch):
    """Drift bug: the page built GenerationRequest(cap, domain) without the failed
    trajectories the CLI showed the LLM."""
    db, ids = store_with_examples
    requests = []

    def spy(request, config=None, db=None, progress=None):
        requests.append(request)
        raise Stop  # the request is what this test is about; the generator is tested apart

    monkeypatch.setattr(generate_mod, "generate_environment", spy)
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    at.selectbox(key="gen_cap").set_value(CAP)
    next(b for b in at.button if b.label == "Generate and validate").click().run()
    with pytest.raises(Stop):
        cli.main(["env", "generate", CAP, "--db", str(db)])
    from_page, from_cli = requests
    assert from_page == from_cli
    assert len(from_page.examples) == len(ids) == 2
    assert all(e.startswith("system:") or e.startswith("user:") for e in from_page.examples)
    assert from_page.description.startswith("Checks what the policy requires")


def test_failure_examples_without_a_store_are_empty(tmp_path):
    assert environments.failure_examples(CAP, tmp_path / "none.duckdb") == ("", [])


def test_status_after_validation_keeps_an_approval():
    assert environments.status_after_validation("approved", "validated") == "approved"
    assert environments.status_after_validation("approved", "rejected") == "rejected"
    assert environments.status_after_validation("draft", "validated") == "validated"
    assert environments.status_after_validation(None, "rejected") == "rejected"


def test_validate_records_the_report_and_keeps_the_approval(db_path):
    report = environments.validate(BUILTIN, n_seeds=5, db=db_path)
    assert report["status"] == "validated"
    assert get_row(BUILTIN, db=db_path)["status"] == "validated"
    environments.approve(BUILTIN, note="ok", db=db_path)
    environments.validate(BUILTIN, n_seeds=5, db=db_path)  # validating again
    row = get_row(BUILTIN, db=db_path)
    assert row["status"] == "approved" and row["report"]["validation"]["status"] == "validated"


def test_a_sandbox_failure_is_a_recorded_rejection(tmp_path, db_path):
    module = tmp_path / "broken_env.py"
    module.write_text("raise SystemExit('no environment here')\n")
    report = environments.validate(str(module), n_seeds=5, db=db_path)
    assert report["status"] == "rejected" and report["checks"]["sandbox"]["passed"] is False
    assert get_row("broken_env", db=db_path) is None  # a file is checked, never recorded


def test_approving_needs_a_validation_and_names_the_environment(db_path):
    with pytest.raises(UserInputError, match=f"'{BUILTIN}' is draft"):
        environments.approve(BUILTIN, db=db_path)
    save_environment(environments.resolve(BUILTIN), status="validated", db=db_path)
    assert environments.approve(BUILTIN, db=db_path) == {"name": BUILTIN,
                                                         "status": "approved"}
    assert environments.reject(BUILTIN, note="no", db=db_path)["status"] == "rejected"
    assert environments.status_of(BUILTIN, db=db_path) == "rejected"


def test_play_and_sample_are_the_same_instance(db_path):
    sample = environments.sample(BUILTIN, seed=4, db=db_path)
    played = environments.play(BUILTIN, seed=4, reference=True, db=db_path)
    assert played["transcript"][0]["content"] == sample["messages"][-1]["content"]
    assert played["summary"]["passed"]


# ------------------------------------------------------------------ plugin environments
PLUGIN_ENV_MODULE = '''
from trace_lib.train.smoke_envs import TargetLetterEnv


def make_env():
    return TargetLetterEnv()
'''


@pytest.fixture
def plugin_env(tmp_path, monkeypatch):
    """A real distribution (dist-info + module) on sys.path that registers "plugin/letters"
    under the `trace_workbench.environments` entry-point group, found by importlib.metadata."""
    from plugin_dist import install_dist

    from trace_lib.envs.registry import ENVIRONMENTS

    site = tmp_path / "site"
    install_dist(site, "trace-env-plugin-demo",
                 {"trace_workbench.environments": {"plugin/letters":
                                                   "trace_env_plugin_demo:make_env"}},
                 modules={"trace_env_plugin_demo": PLUGIN_ENV_MODULE})
    monkeypatch.syspath_prepend(str(site))
    ENVIRONMENTS.reload_entry_points()
    yield "plugin/letters"
    monkeypatch.undo()
    ENVIRONMENTS.reload_entry_points()


def test_plugin_environments_appear_in_the_pickers_and_train(plugin_env, db_path):
    offered = environments.trainable_environments(db_path)
    row = next(r for r in offered if r["name"] == plugin_env)
    assert row["source"] == "python" and row["status"] == environments.OWN_CODE_STATUS
    assert plugin_env in environments.environment_names()  # the Routing page's pickers
    cfg = environments.job_environment({"env": plugin_env}, db=db_path)
    assert cfg["env_spec"]["factory"] == "trace_env_plugin_demo:make_env"
    with environments.open_environment(plugin_env, db=db_path) as env:
        env.reset(1)
        assert env.capability == "toy_target_letter"


def test_the_training_page_offers_a_plugin_environment(plugin_env, db_path, monkeypatch):
    monkeypatch.setenv("TRACE_DB", str(db_path))
    with store.connect(db_path):  # an empty store: the page needs one to exist
        pass
    page = str(Path(__file__).resolve().parents[2] / "pages" / "5_Training.py")
    at = AppTest.from_file(page, default_timeout=120).run()
    assert not at.exception
    picker = next(s for s in at.selectbox if s.label == "Environment")
    assert plugin_env in picker.options
