"""`evaluate --router`: a per-request composition (`moe-merge --per-request`) evaluated through
an OpenAI endpoint serving its adapters, each episode sent where its request routes.

Real parts throughout: the tiny model, real PEFT adapters, the project's policy server on
127.0.0.1 (started by the evaluation, or by the test and given as --server-url)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.workbench import evaluation

sys.path.insert(0, str(Path(__file__).parent))
from routed_export import make_routed_export  # noqa: E402

TINY = {"tasks": 1, "tools": "capability", "max_model_len": 16384, "max_tokens": 12,
        "max_turns": 2}


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))


@pytest.fixture(scope="module")
def routed_dir(tmp_path_factory) -> Path:
    return make_routed_export(tmp_path_factory.mktemp("routed"))


def _records(db_path: Path, dataset_id: str) -> list[dict]:
    from trace_lib.trajectories import chat_messages, load_trajectories

    with store.connect(db_path, read_only=True) as con:
        ids = [r[0] for r in con.execute("SELECT id FROM trajectories WHERE dataset_id = ? "
                                         "ORDER BY task_id", [dataset_id]).fetchall()]
        stored = load_trajectories(con, ids)
    return [{"messages": chat_messages(s.trajectory), "meta": s.trajectory.meta}
            for s in stored]


def test_routed_episodes_are_the_chosen_adapters_episodes(db_path, routed_dir) -> None:
    routed = evaluation.evaluate(db_path, {**TINY, "router": str(routed_dir)})
    assert routed["policy"] == "tiny+router:export" and routed["trajectories"] == 1
    rec = _records(db_path, routed["dataset_id"])[0]
    assert rec["meta"]["routed_to"] == "cap_b"
    prov = rec["meta"]["provenance"]
    assert prov["router"] == str(routed_dir.resolve()) and prov["model"] == "tiny"
    assert prov["routes"] == {"cap_a": "cap_a", "cap_b": "cap_b"}
    # greedy: the routed episode is exactly cap_b's merged adapter's episode
    direct = evaluation.evaluate(db_path, {**TINY, "model": "tiny",
                                           "adapter": str(routed_dir / "cap_b")})
    mine = [m for m in rec["messages"] if m["role"] == "assistant"]
    assert mine == [m for m in _records(db_path, direct["dataset_id"])[0]["messages"]
                    if m["role"] == "assistant"]


def test_every_turn_of_an_episode_goes_to_the_routed_adapter(db_path, routed_dir) -> None:
    """On the wire: a reference-policy endpoint that answers only as `cap_b` plays 3 tasks
    to the end (several turns each); one request to another name would be a 404."""
    from reference_policy import ReferencePolicyServer

    from trace_lib.evaluate.tasks import load_task_set

    with ReferencePolicyServer(load_task_set("airline", 3), model="cap_b") as srv:
        out = evaluation.evaluate(db_path, {"router": str(routed_dir), "server_url": srv.url,
                                            "served_model": "tiny-base", "tasks": 3,
                                            "concurrency": 3})
    assert out["successes"] == 3
    assert len(srv.requests) > 3 and {r["model"] for r in srv.requests} == {"cap_b"}
    assert {r["meta"]["routed_to"] for r in _records(db_path, out["dataset_id"])} == {"cap_b"}


def test_router_over_a_server_url_needs_the_adapters_served(db_path, routed_dir) -> None:
    import httpx

    from trace_lib.runtime.policy_server import PolicyServer, ServerConfig

    with PolicyServer(ServerConfig(model="tiny", max_model_len=16384)) as srv:
        cfg = {**TINY, "router": str(routed_dir), "server_url": srv.base_url,
               "served_model": srv.model_name}
        with pytest.raises(UserInputError, match=r"does not serve \['cap_a', 'cap_b'\].*"
                                                 r"vllm serve tiny --enable-lora"):
            evaluation.evaluate(db_path, cfg)
        for cap in ("cap_a", "cap_b"):  # what `vllm serve ... --lora-modules` does
            resp = httpx.post(f"{srv.url}/v1/load_lora_adapter",
                              json={"lora_name": cap, "lora_path": str(routed_dir / cap)})
            assert resp.status_code == 200
        out = evaluation.evaluate(db_path, cfg)
    rec = _records(db_path, out["dataset_id"])[0]
    assert rec["meta"]["routed_to"] == "cap_b"
    assert rec["meta"]["provenance"]["server_url"] == srv.base_url


def test_router_errors_name_the_problem(db_path, routed_dir, tmp_path) -> None:
    with pytest.raises(UserInputError, match="no router.json"):
        evaluation.evaluate(db_path, {**TINY, "router": str(tmp_path)})
    with pytest.raises(UserInputError, match="at most one of --adapter, --moe, --router"):
        evaluation.evaluate(db_path, {**TINY, "router": str(routed_dir),
                                      "adapter": str(routed_dir / "cap_a")})
    (tmp_path / "router.json").write_text('{"format": "other"}')
    with pytest.raises(UserInputError, match="expected 'trace-router/1'"):
        evaluation.evaluate(db_path, {**TINY, "router": str(tmp_path)})
