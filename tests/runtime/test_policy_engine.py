"""The engine's KV reuse (group prefill once, prefix cache, a rollout's next turn) changes
nothing in what is sampled: two real servers over HTTP, one with the caches and one without,
give the same token ids and logprobs (1e-4) for greedy and seeded requests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from policy_fixtures import TOOLS, build_tool_model, private_models_dir  # noqa: E402

from trace_lib.runtime.policy_client import OpenAIPolicyClient  # noqa: E402
from trace_lib.runtime.policy_server import PolicyServer, ServerConfig  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a support agent. Verify before acting. " * 12}


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    with private_models_dir(tmp_path_factory.mktemp("models")):
        yield build_tool_model(tmp_path_factory.mktemp("tool_model"))


@pytest.fixture(scope="module")
def servers(tool_model):
    cold = PolicyServer(ServerConfig(model=str(tool_model), served_model_name="m",
                                     kv_cache_mb=0))
    warm = PolicyServer(ServerConfig(model=str(tool_model), served_model_name="m"))
    with cold, warm:
        with OpenAIPolicyClient(cold.base_url) as c, OpenAIPolicyClient(warm.base_url) as w:
            yield {"cold": (cold, c), "warm": (warm, w)}


def same(a, b) -> None:
    assert [x.token_ids for x in a] == [y.token_ids for y in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def episode(client, seed: int | None, user: str) -> list:
    """Two turns of one rollout: the second prompt extends the first prompt + completion."""
    opening = [SYSTEM, {"role": "user", "content": user}]
    temp = 0.0 if seed is None else 1.0
    first = client.chat(opening, tools=TOOLS, max_tokens=24, temperature=temp, seed=seed)
    follow = opening + [first[0].message, {"role": "user", "content": "and the next one?"}]
    second = client.chat(follow, tools=TOOLS, max_tokens=16, temperature=temp, seed=seed)
    return [first, second]


@pytest.mark.parametrize("seed", [None, 3])
def test_turns_and_seeds_are_identical_with_and_without_caches(servers, seed):
    warm_engine = servers["warm"][0].service.engine
    hits = warm_engine.prefix_cache.hit_tokens
    runs = {}
    for name, (_, client) in servers.items():
        runs[name] = [episode(client, seed, user) for user in ("Find user u1", "Find u2 now")]
    for cold_ep, warm_ep in zip(runs["cold"], runs["warm"], strict=True):
        for cold_turn, warm_turn in zip(cold_ep, warm_ep, strict=True):
            same(cold_turn, warm_turn)
    assert servers["cold"][0].service.engine.prefix_cache.hit_tokens == 0
    # The warm server reused the shared system+tools block for the second user and each
    # episode's first turn for its second: at least the opening prompt of every follow-up.
    opening = len(runs["warm"][0][0][0].prompt_token_ids)
    assert warm_engine.prefix_cache.hit_tokens - hits >= 3 * opening


def test_a_group_is_prefilled_once_and_sampled_as_before(servers):
    prompt = [SYSTEM, {"role": "user", "content": "a group of eight"}]
    out = {name: client.chat(prompt, tools=TOOLS, n=8, max_tokens=12, temperature=1.0,
                             seed=11) for name, (_, client) in servers.items()}
    same(out["cold"], out["warm"])
    cold = servers["cold"][0].service.engine.prefix_cache
    before = cold.miss_tokens
    again = servers["cold"][1].chat(prompt + [{"role": "user", "content": "x"}], n=8,
                                    max_tokens=2, temperature=1.0, seed=1)
    # eight rows, one prefill: the prompt's tokens were computed once (no cache here)
    assert cold.miss_tokens - before == len(again[0].prompt_token_ids)


@pytest.mark.parametrize("later_prompt", ["short", "a much longer prompt than the first " * 6])
def test_a_request_joins_a_running_batch_and_samples_as_if_alone(servers, later_prompt):
    """Continuous batching: a request arriving mid-decode is merged into the running
    cohort (caches padded to one width, histories aligned), yet both get exactly the
    tokens they get alone."""
    from trace_lib.runtime.policy_engine import SamplingParams

    server, _ = servers["cold"]
    engine = server.service.engine
    first, later = [server.service.parse_request(
        {"model": "m", "messages": [{"role": "user", "content": text}]})[0]
        for text in ("tell me a long story", later_prompt)]
    long_p = SamplingParams(temperature=1.0, max_tokens=200, seed=5, ignore_eos=True,
                            top_logprobs=2)
    short_p = SamplingParams(temperature=1.0, max_tokens=6, seed=6, top_logprobs=2)
    alone_long = engine.submit(first, 2, long_p, None).result()
    alone_short = engine.submit(later, 1, short_p, None).result()
    merges = engine.stats["merges"]
    running = engine.submit(first, 2, long_p, None)
    _wait(lambda: any(j["generated"] >= 3 for j in engine.running()))
    joined = engine.submit(later, 1, short_p, None).result()
    together = running.result()
    assert engine.stats["merges"] == merges + 1
    same(joined, alone_short)
    same(together, alone_long)
    for x, y in zip(joined + together, alone_short + alone_long, strict=True):
        for a, b in zip(x.top_logprobs, y.top_logprobs, strict=True):
            assert [t for t, _ in a] == [t for t, _ in b]
            assert [v for _, v in a] == pytest.approx([v for _, v in b], abs=1e-4)


def _wait(predicate, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the engine"
        time.sleep(0.005)
