"""One name -> environment path: catalog.resolve (app side), a serialised spec (what a job gets), and
`build_env` (built-ins in-process, generated code only in the sandbox). Real DuckDB files,
a real sandbox."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from envs_fixture import generated_spec

from trace_lib.envs import catalog, registry
from trace_lib.envs.catalog import save_environment
from trace_lib.envs.registry import EnvSpec
from trace_lib.errors import UserInputError


def _gen_spec() -> EnvSpec:
    return generated_spec("toy/echo/gen3", version=3, reward="exact")


def test_spec_round_trips_through_json_with_its_code():
    spec = _gen_spec()
    data = json.loads(json.dumps(spec.to_json()))
    assert data["code_sha256"] == spec.code_sha256
    assert EnvSpec.from_json(data) == spec
    builtin = registry.require_static("airline/precondition_verification")
    assert "code" not in builtin.to_json()
    assert EnvSpec.from_json(builtin.to_json()).name == "airline/precondition_verification"


@pytest.mark.parametrize(("data", "match"), [
    ("x", "expected an object"),
    ({"source": "builtin"}, "field `name` is required"),
    ({"name": "a", "source": "magic"}, "field `source` is 'magic'; expected one of builtin"),
    ({"name": "a", "source": "generated"}, "needs its module's source in field `code`"),
    ({"name": "a", "source": "generated", "code": "x = 1", "code_sha256": "00"},
     "does not match `code_sha256`"),
    ({"name": "a", "source": "python", "factory": "nocolon"}, "needs field `factory`"),
    ({"name": "a/b", "source": "builtin", "domain": "a", "capability": "b"},
     "built-in environment 'a/b' .* does not exist here"),
    ({"name": "a", "source": "file", "code": "x", "version": "2"}, "field `version`"),
    ({"name": "a", "source": "file", "code": "x", "colour": 1}, r"unknown fields \['colour'\]"),
])
def test_bad_serialised_specs_name_the_field(data, match):
    with pytest.raises(UserInputError, match=match):
        EnvSpec.from_json(data, where="spec.json: config.env_spec")


def test_generated_code_runs_only_in_the_sandbox_and_builtins_in_process():
    env = registry.build_env(_gen_spec())
    try:
        assert type(env).__name__ == "SandboxedEnvironment"
        env.reset(4)
        assert env.messages[-1]["content"] == "say 4"
    finally:
        env.close()
    builtin = registry.build_env(registry.require_static("retail/precondition_verification"))
    builtin.reset(1)
    assert builtin.capability == "precondition_verification" and builtin.tool_schemas
    own = registry.env_factory(registry.require_static("trace_lib.train.smoke_envs:TargetLetterEnv"))()
    assert own.capability == "toy_target_letter"


def test_the_app_resolves_stored_names_and_a_job_builds_from_the_spec_alone(db_path):
    save_environment(_gen_spec(), status="approved", db=db_path)
    spec = catalog.resolve("toy/echo/gen3", db=db_path)  # the app side reads the store
    assert spec.source == "generated" and spec.code == _gen_spec().code
    job_spec = registry.spec_for_job("toy/echo/gen3", spec.to_json())
    assert job_spec == spec
    with registry.open_environment(job_spec) as env:
        env.reset(2)
        env.step({"content": "2"})
        assert env.summary()["reward"] == 1.0
    # Without its spec a job cannot build a stored name, and says how to launch it.
    with pytest.raises(UserInputError, match="carries no `env_spec`.*never reads the store"):
        registry.spec_for_job("toy/echo/gen3")
    with pytest.raises(UserInputError, match="`env` is 'other/name' but `env_spec` describes"):
        registry.spec_for_job("other/name", spec.to_json())


def test_spec_for_job_never_imports_the_store():
    code = ("import sys; from trace_lib.envs import registry; "
            "s = registry.spec_for_job('x', {'name': 'x', 'source': 'generated', 'code': 'y'}); "
            "registry.spec_for_job('airline/precondition_verification'); "
            "print(sorted(m for m in sys.modules if m.startswith(('duckdb', 'trace_lib.store', "
            "'trace_lib.envs.catalog'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_names_are_explained(db_path):
    with pytest.raises(UserInputError, match="'nope/none': not a built-in"):
        catalog.resolve("nope/none", db=db_path)
    with pytest.raises(UserInputError, match="'toy/echo/gen3': not a built-in"):
        registry.require_static("toy/echo/gen3")  # the job side: no store, no stored names
    with pytest.raises(UserInputError, match="no such environment module file"):
        catalog.resolve("missing_env_module.py")
    with pytest.raises(UserInputError, match="module 'json' has no 'Nope'"):
        catalog.resolve("json:Nope")
