"""Training use cases on real DuckDB files and real run directories: which environments
training accepts (the approval rule, for `train` and `gates` alike), the serialised
environment a job receives, one training config, adapters, and `job status` reading the
run directory the database recorded."""

from __future__ import annotations

import json

import pytest

from trace_lib import cli, jobs
from trace_lib.envs.catalog import save_environment
from trace_lib.envs.registry import EnvSpec
from trace_lib.errors import UserInputError
from trace_lib.workbench import environments, training
from trace_lib.workbench import jobs as wb_jobs

GEN_CODE = "def make_env():\n    raise RuntimeError('never imported in the host')\n"
BUILTIN = "airline/precondition_verification"


def _generated(db, name: str, status: str) -> None:
    cap = name.split("/")[1]
    save_environment(EnvSpec(name=name, capability=cap, domain=name.split("/")[0], version=1,
                             source="generated", code=GEN_CODE), status=status, db=db)


def test_builtins_offered_only_when_asked_and_approved_always(db_path):
    _generated(db_path, "retail/precondition_verification/gen1", "approved")
    approved = environments.trainable_environments(db_path)
    assert [e["name"] for e in approved] == ["retail/precondition_verification/gen1"]
    with_builtins = {e["name"] for e in environments.trainable_environments(db_path, True)}
    assert BUILTIN in with_builtins
    assert "retail/precondition_verification/gen1" in with_builtins


def test_generated_environment_code_travels_in_the_spec(db_path):
    _generated(db_path, "retail/tool_calling_precision/gen2", "approved")
    cfg = environments.job_environment({"env": "retail/tool_calling_precision/gen2"},
                                       db=db_path)
    assert cfg["env_spec"]["code"] == GEN_CODE and cfg["env_spec"]["source"] == "generated"
    assert EnvSpec.from_json(cfg["env_spec"]).capability == "tool_calling_precision"
    # A smoke run on a built-in and your own module travel as a spec without code.
    for name, source in ((BUILTIN, "builtin"), ("trace_lib.train.smoke_envs:LookupEnv",
                                                "python")):
        spec = environments.job_environment({"env": name}, db=db_path,
                                            allow_unreviewed_builtin=True)["env_spec"]
        assert spec["source"] == source and "code" not in spec
    with pytest.raises(UserInputError, match="nope/none"):
        environments.job_environment({"env": "nope/none"}, db=db_path)


@pytest.mark.parametrize("status", ["draft", "validated", "rejected"])
def test_only_approved_environments_train_from_the_cli(db_path, tmp_path, monkeypatch, capsys,
                                                       status):
    """Drift bug: `train` on the CLI accepted a draft or rejected environment."""
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    name = "retail/tool_calling_precision/gen3"
    _generated(db_path, name, status)
    code = cli.main(["train", "--db", str(db_path), "--env", name, "--background",
                     "--steps", "1", "--group", "2"])
    err = capsys.readouterr().err
    assert code == 1
    assert name in err and f"is {status}" in err and "only approved" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_builtin_nobody_reviewed_is_refused_unless_asked_for_a_smoke_run(db_path):
    config = training.build_config(BUILTIN, steps=1, group=2)
    with pytest.raises(UserInputError, match=f"'{BUILTIN}' is draft"):
        environments.job_environment(config, db=db_path)
    assert environments.job_environment(config, db=db_path,
                                        allow_unreviewed_builtin=True)["env_spec"]
    environments.approve(BUILTIN, force=True, db=db_path)
    environments.reject(BUILTIN, db=db_path)
    with pytest.raises(UserInputError, match="is rejected"):  # a rejection always wins
        environments.job_environment(config, db=db_path, allow_unreviewed_builtin=True)


def test_gate_training_checks_approval_too(db_path, tmp_path, capsys):
    """Drift bug: `gates` accepted environments nobody approved; the check runs before the
    composed model is even opened."""
    code = cli.main(["gates", "--db", str(db_path), "--moe", str(tmp_path / "moe"),
                     "--envs", BUILTIN, "--background"])
    err = capsys.readouterr().err
    assert code == 1 and BUILTIN in err and "is draft" in err


def test_the_training_config_is_built_once():
    """The CLI's flags and the page's fields both go through `build_config`; every field
    the CLI leaves at its default equals TrainConfig's default."""
    from trace_lib.cli.train import config_from_args

    parser = cli.build_parser()
    args = parser.parse_args(["train", "--env", BUILTIN])
    assert config_from_args(args) == training.build_config(BUILTIN)
    cfg = training.build_config(BUILTIN, lora_targets="q_proj, v_proj", kl_coef=0.1,
                                adv_scale="batch", steps=3)
    assert cfg["lora"]["targets"] == ["q_proj", "v_proj"]
    assert cfg["loss"]["kl_coef"] == 0.1 and cfg["loss"]["scale"] == "batch"
    assert cfg["steps"] == 3 and cfg["lora"]["rank"] == training.defaults().lora.rank
    with pytest.raises(UserInputError, match="group"):
        training.build_config(BUILTIN, group=1)


def test_job_status_reads_the_run_directory_the_database_recorded(db_path, tmp_path,
                                                                   monkeypatch, capsys):
    """Drift bug: `job status` looked under the current TRACE_RUNS_DIR only."""
    first = tmp_path / "runs-then"
    spec = jobs.JobSpec(kind="train_adapter", config={"env": "x"},
                        run_dir=str(first / "train-job-1"), id="train-job-1")
    spec.path.mkdir(parents=True)
    (spec.path / "spec.json").write_text(json.dumps(spec.to_dict()))
    jobs.update_status(spec.path, state="succeeded", backend="local", kind=spec.kind)
    wb_jobs.record_job(db_path, spec)
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs-now"))  # the runs folder moved
    assert cli.main(["job", "status", spec.id, "--db", str(db_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "succeeded" and out["run_dir"] == spec.run_dir
    assert wb_jobs.job_status(db_path, spec.id).state == "succeeded"


def test_list_adapters_reads_before_after(db_path):
    result = {"capability": "cap", "env": "e", "adapter_path": "/x/adapter",
              "base_model": "tiny", "final_reward": 0.5, "steps": 3,
              "eval_before": {"pass_rate": 0.25}, "eval_after": {"pass_rate": 0.75}}
    assert training.record_adapter(db_path, result, "job1") == "a_job1"
    training.record_adapter(db_path, result, "job1")  # idempotent
    rows = training.list_adapters(db_path)
    assert len(rows) == 1
    assert (rows[0]["pass_rate_before"], rows[0]["pass_rate_after"]) == (0.25, 0.75)
    assert json.dumps(rows[0], default=str)


def test_a_spec_file_goes_through_the_same_rule(db_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    for spec in ({"kind": "train_adapter", "config": {"env": BUILTIN}},
                 {"kind": "train_gates", "config": {"moe": str(tmp_path), "envs": [BUILTIN]}}):
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(spec))
        assert cli.main(["job", "submit", str(path), "--db", str(db_path)]) == 1
        assert f"'{BUILTIN}' is draft" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
