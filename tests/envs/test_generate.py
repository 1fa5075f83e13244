"""The generation agent against a local server speaking the real wire formats: a good
module ends validated; a broken one gets its errors fed back, then is rejected."""

from __future__ import annotations

import json
import textwrap

import pytest

from trace_lib.envs import catalog, is_approved, list_environments, open_environment
from trace_lib.envs.generate import (
    GenerationConfig,
    GenerationRequest,
    generate_environment,
)
from trace_lib.envs.sandbox import SandboxLimits
from trace_lib.envs.validate import ValidationConfig

GOOD = textwrap.dedent('''
    """Count passengers on a reservation: a structured-data question, read-only."""
    from trace_lib.envs.capabilities.task_env import EnvConfig, Task, TaskEnvironment


    def builder(db, rng, difficulty):
        ids = sorted(db.reservations)
        rid = ids[rng.randrange(len(ids))]
        n = len(db.reservations[rid].passengers)
        read = {"name": "get_reservation_details", "arguments": {"reservation_id": rid}}
        return Task(request=f"How many passengers are on my reservation {rid}?",
                    actions=[read], answer=f"There are {n} passengers on {rid}.",
                    answer_items=[[str(n)]], required_reads=[read],
                    hint="Read the reservation and count its passengers.")


    def make_env():
        return TaskEnvironment("airline/structured_data_reasoning/gen1",
                               "structured_data_reasoning", "airline", builder,
                               EnvConfig(difficulty=1, db_size={"n_users": 12, "n_days": 24}))
''')

# Valid Python that breaks the contract: it invents a tool the domain does not have.
BROKEN = GOOD.replace(
    "def make_env():",
    "class Extra(TaskEnvironment):\n    @property\n    def tool_schemas(self):\n"
    "        return super().tool_schemas + [{'type': 'function', 'function': {'name': "
    "'refund_all', 'parameters': {'type': 'object', 'properties': {}}}}]\n\n\n"
    "def make_env():",
).replace("return TaskEnvironment(", "return Extra(")

SYNTAX_ERROR = "def make_env(:\n    return None\n"
HOSTILE = "import os\n\ndef make_env():\n    os.system('echo owned')\n"

FAST = ValidationConfig(n_seeds=6, determinism_seeds=2)
LIMITS = SandboxLimits(load_timeout_s=30, call_timeout_s=10)


def reply(code: str) -> dict:
    return {"content": json.dumps({"code": code, "notes": "test module"})}


def _config(llm, provider="openai", attempts=3):
    return GenerationConfig(generator="llm", provider=provider, model="test-model",
                            # the SDKs' conventions: OpenAI's base URL ends in /v1,
                            # Anthropic's is the host (the SDK adds /v1/messages)
                            base_url=llm.url + ("/v1" if provider == "openai" else ""),
                            max_attempts=attempts,
                            validation=FAST, limits=LIMITS)


def test_good_module_is_validated_and_stored(scripted_llm, db_path):
    scripted_llm.script = [reply(GOOD)]
    request = GenerationRequest("structured_data_reasoning", "airline",
                                examples=["user: how many?\nassistant: 3 (wrong)"])
    result = generate_environment(request, _config(scripted_llm), db=db_path)
    assert result["status"] == "validated", result["history"]
    assert result["attempts"] == 1 and result["name"] == "airline/structured_data_reasoning/gen1"
    sent = scripted_llm.requests[0]
    assert scripted_llm.paths[0] == "/v1/chat/completions"
    prompt = sent["messages"][1]["content"]
    assert "structured_data_reasoning" in prompt and "get_reservation_details" in prompt
    assert "how many?" in prompt  # the example failed trajectory reached the model
    assert sent["response_format"]["type"] == "json_schema"
    row = catalog.get_row(result["name"], db=db_path)
    assert row["status"] == "validated" and row["code"].strip() == GOOD.strip()
    assert row["report"]["validation"]["figures"]["reference_solves"] == 1.0
    attempts = catalog.list_attempts(generation_id=result["generation_id"], db=db_path)
    assert [a["status"] for a in attempts] == ["validated"]
    assert attempts[0]["code_sha256"] == result["code_sha256"]
    # stored generated code is served from the sandbox, never imported here
    with open_environment(result["name"], db=db_path) as env:
        assert type(env).__name__ == "SandboxedEnvironment"
        env.reset(1)
        assert "passengers" in env.messages[-1]["content"]
    assert not is_approved(result["name"], db=db_path)
    names = [e["name"] for e in list_environments(db=db_path)]
    assert result["name"] in names


def test_errors_are_fed_back_until_the_module_is_fixed(scripted_llm, db_path):
    scripted_llm.script = [reply(SYNTAX_ERROR), reply(BROKEN), reply(GOOD)]
    result = generate_environment(GenerationRequest("structured_data_reasoning", "airline"),
                                  _config(scripted_llm), db=db_path)
    assert result["status"] == "validated" and result["attempts"] == 3
    second = scripted_llm.requests[1]["messages"][1]["content"]
    assert "syntax: line 1" in second and SYNTAX_ERROR.strip() in second
    third = scripted_llm.requests[2]["messages"][1]["content"]
    assert "schema_fidelity" in third and "refund_all" in third
    statuses = [h["status"] for h in result["history"]]
    assert statuses == ["rejected", "rejected", "validated"]


def test_a_module_that_stays_broken_is_rejected(scripted_llm, db_path):
    scripted_llm.script = [reply(BROKEN)]
    result = generate_environment(GenerationRequest("structured_data_reasoning", "airline"),
                                  _config(scripted_llm, attempts=2), db=db_path)
    assert result["status"] == "rejected" and result["attempts"] == 2
    assert any("schema_fidelity" in e for e in result["errors"])
    assert "refund_all" in scripted_llm.requests[1]["messages"][1]["content"]
    row = catalog.get_row(result["name"], db=db_path)
    assert row["status"] == "rejected"
    assert len(catalog.list_attempts(env_name=result["name"], db=db_path)) == 2
    with pytest.raises(Exception, match="only a validated environment"):
        catalog.set_status(catalog_spec(result["name"], db_path), "approved", db=db_path)


def catalog_spec(name, db):
    return catalog.resolve(name, db=db)


def test_hostile_generated_code_is_contained_and_rejected(scripted_llm, db_path):
    scripted_llm.script = [reply(HOSTILE)]
    result = generate_environment(GenerationRequest("precondition_verification", "airline"),
                                  _config(scripted_llm, attempts=1), db=db_path)
    assert result["status"] == "rejected"
    assert "violation" in result["errors"][0] and "os.system" in result["errors"][0]


def test_anthropic_messages_wire_format(scripted_llm, db_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-stored")
    scripted_llm.script = [reply(GOOD)]
    result = generate_environment(GenerationRequest("structured_data_reasoning", "airline"),
                                  _config(scripted_llm, provider="anthropic"), db=db_path)
    assert result["status"] == "validated"
    assert scripted_llm.paths[0] == "/v1/messages"
    assert scripted_llm.requests[0]["tool_choice"]["name"] == "environment_module"
    row = catalog.get_row(result["name"], db=db_path)
    assert "test-key-not-stored" not in json.dumps(row, default=str)


def test_template_generator_works_offline(db_path):
    cfg = GenerationConfig(validation=FAST, limits=LIMITS, difficulty=3)
    result = generate_environment(GenerationRequest("tool_calling_precision", "retail"), cfg,
                                  db=db_path)
    assert result["status"] == "validated" and result["generator"] == "template"
    row = catalog.get_row(result["name"], db=db_path)
    assert "TEMPLATE generator" in row["code"] and "difficulty=3" in row["code"]
    second = generate_environment(GenerationRequest("tool_calling_precision", "retail"), cfg,
                                  db=db_path)
    assert second["name"].endswith("/gen2")
