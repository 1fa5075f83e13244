"""The CPU policy server, driven over real HTTP through the `openai` SDK and our client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from policy_fixtures import (  # noqa: E402
    ASK,
    TOOLS,
    build_tool_model,
    make_lora,
    private_models_dir,
    teacher_forced_logprobs,
)

from trace_lib.runtime import base_models as models  # noqa: E402
from trace_lib.runtime.policy_client import (  # noqa: E402
    OpenAIPolicyClient,
    PolicyClient,
    PolicyServerError,
)
from trace_lib.runtime.policy_server import PolicyServer, ServerConfig  # noqa: E402
from trace_lib.runtime.server_kinds import free_port  # noqa: E402


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    with private_models_dir(tmp_path_factory.mktemp("models")) as path:
        yield path


@pytest.fixture(scope="module")
def tool_model(models_dir, tmp_path_factory):
    return build_tool_model(tmp_path_factory.mktemp("tool_model"))


@pytest.fixture(scope="module")
def server(tool_model):
    with PolicyServer(ServerConfig(model=str(tool_model), served_model_name="tiny-tools")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with OpenAIPolicyClient(server.base_url) as c:
        yield c


def test_openai_sdk_sees_a_conformant_server(server, tool_model):
    sdk = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0)
    cards = sdk.models.list().data
    assert [c.id for c in cards] == ["tiny-tools"]
    resp = sdk.chat.completions.create(
        model="tiny-tools", messages=[{"role": "user", "content": "hello <b>there</b>"}],
        n=3, max_tokens=8, temperature=1.0, logprobs=True, top_logprobs=3,
        extra_body={"return_token_ids": True})
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert [c.index for c in resp.choices] == [0, 1, 2]
    _, tok = models.load_model(str(tool_model))
    expected_prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hello <b>there</b>"}], add_generation_prompt=True,
        tokenize=True, return_dict=True)["input_ids"]
    assert resp.model_extra["prompt_token_ids"] == list(expected_prompt)
    assert resp.usage.prompt_tokens == len(expected_prompt)
    total = 0
    for choice in resp.choices:
        ids = choice.model_extra["token_ids"]
        entries = choice.logprobs.content
        assert 1 <= len(ids) <= 8 and len(entries) == len(ids)
        assert choice.finish_reason in ("stop", "length")
        stop_ids = {tok.eos_token_id, tok.pad_token_id}  # <|im_end|>, <|endoftext|>
        assert (choice.finish_reason == "length") == (len(ids) == 8 and ids[-1] not in stop_ids)
        assert all(t not in stop_ids for t in ids[:-1])  # nothing is sampled after a stop
        for e in entries:
            assert len(e.top_logprobs) == 3 and e.logprob <= 0
            assert e.top_logprobs[0].logprob >= e.logprob - 1e-6  # top-1 is the max
        total += len(ids)
    assert resp.usage.completion_tokens == total


def test_logprobs_equal_a_teacher_forced_pass_under_batching(client, tool_model):
    model, _ = models.load_model(str(tool_model))
    prompts = [[{"role": "user", "content": "x " * k}] for k in (1, 7, 20, 3)]
    with ThreadPoolExecutor(4) as pool:  # concurrent: decoded together, left-padded
        results = list(pool.map(lambda m: client.chat(m, n=2, max_tokens=12), prompts))
    for comps in results:
        for comp in comps:
            assert len(comp.token_ids) == len(comp.logprobs) > 0
            ref = teacher_forced_logprobs(model, comp.prompt_token_ids, comp.token_ids)
            assert comp.logprobs == pytest.approx(ref, abs=2e-4)


def test_logprobs_are_of_the_tempered_distribution_sampled_from(server, client, tool_model):
    """At temperature 0.7 the reported log-probs are of logits / 0.7 (vLLM's
    processed_logprobs), the behaviour policy the trainer's loss scores; top-p masks the
    tail and renormalises, so a nucleus token's log-prob rises above the tempered one."""
    model, _ = models.load_model(str(tool_model))
    comp = client.chat(ASK, n=2, max_tokens=12, temperature=0.7, seed=3)
    for c in comp:
        ref = teacher_forced_logprobs(model, c.prompt_token_ids, c.token_ids, temperature=0.7)
        assert c.logprobs == pytest.approx(ref, abs=2e-4)
        raw = teacher_forced_logprobs(model, c.prompt_token_ids, c.token_ids)
        assert max(abs(a - b) for a, b in zip(c.logprobs, raw, strict=True)) > 1e-3
    nucleus = client.chat(ASK, n=1, max_tokens=12, temperature=0.7, top_p=0.5, seed=3)[0]
    ref = teacher_forced_logprobs(model, nucleus.prompt_token_ids, nucleus.token_ids,
                                  temperature=0.7)
    assert all(a >= b - 1e-5 for a, b in zip(nucleus.logprobs, ref, strict=True))
    # Tokens outside the nucleus are -inf: over HTTP they arrive as vLLM's -9999.0, valid
    # JSON (a bare -Infinity is not, and failed the response).
    raw = httpx.post(server.base_url + "/chat/completions", json={
        "messages": ASK, "temperature": 0.7, "top_p": 0.2, "seed": 3, "max_tokens": 4,
        "logprobs": True, "top_logprobs": 20})
    assert raw.status_code == 200, raw.text
    def no_constants(name):
        raise AssertionError(f"{name} in the JSON")
    tops = [t["logprob"] for c in json.loads(raw.text, parse_constant=no_constants)[
        "choices"][0]["logprobs"]["content"] for t in c["top_logprobs"]]
    assert min(tops) == -9999.0 and max(tops) <= 0.0


def test_seed_reproduces_and_greedy_matches_generate(client, tool_model):
    a = client.chat(ASK, n=2, max_tokens=10, seed=7)
    b = client.chat(ASK, n=2, max_tokens=10, seed=7)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    model, tok = models.load_model(str(tool_model))
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                     add_generation_prompt=True, return_dict=True,
                                     return_tensors="pt")
    with torch.inference_mode():
        ref = model.generate(**prompt, max_new_tokens=10, do_sample=False)
    greedy = client.chat([{"role": "user", "content": "hi"}], max_tokens=10, temperature=0)[0]
    expected = ref[0, prompt["input_ids"].shape[1]:].tolist()
    assert greedy.token_ids == expected[:len(greedy.token_ids)]


def test_tool_calls_come_back_as_openai_tool_calls(server, client):
    comp = client.chat(ASK, tools=TOOLS, temperature=0, max_tokens=64)[0]
    assert comp.finish_reason == "tool_calls"
    assert comp.content == "Sure."
    assert len(comp.tool_calls) == 1
    call = comp.tool_calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_user"
    assert json.loads(call["function"]["arguments"]) == {"user_id": "u1"}
    # The assistant message goes straight back into the conversation.
    follow = ASK + [comp.message, {"role": "tool", "tool_call_id": call["id"],
                                   "content": '{"name": "Ann"}'}]
    assert client.chat(follow, tools=TOOLS, max_tokens=4)[0].token_ids
    # tool_choice="none": the same generation stays text.
    raw = httpx.post(server.base_url + "/chat/completions", json={
        "messages": ASK, "tools": TOOLS, "tool_choice": "none", "temperature": 0,
        "max_tokens": 64}).json()["choices"][0]
    assert "<tool_call>" in raw["message"]["content"] and "tool_calls" not in raw["message"]
    assert raw["finish_reason"] == "stop"


def test_lora_adapters_hot_swap_like_vllm(server, client, tool_model, tmp_path):
    from peft import PeftModel

    first = make_lora(tool_model, tmp_path / "step1", seed=1)
    second = make_lora(tool_model, tmp_path / "step2", seed=2)
    client.load_adapter("cap", str(first))
    cards = httpx.get(server.base_url + "/models").json()["data"]
    assert {(c["id"], c["parent"]) for c in cards} == {("tiny-tools", None), ("cap", "tiny-tools")}

    base = client.chat(ASK, max_tokens=6, temperature=0)[0]
    tuned = client.chat(ASK, model="cap", max_tokens=6, temperature=0)[0]
    model, _ = models.load_model(str(tool_model))
    peft_model = PeftModel.from_pretrained(model, str(first))
    ref = teacher_forced_logprobs(peft_model, tuned.prompt_token_ids, tuned.token_ids)
    assert tuned.logprobs == pytest.approx(ref, abs=2e-4)
    with peft_model.disable_adapter():
        ref_base = teacher_forced_logprobs(peft_model, base.prompt_token_ids, base.token_ids)
        untuned = teacher_forced_logprobs(peft_model, tuned.prompt_token_ids, tuned.token_ids)
    assert base.logprobs == pytest.approx(ref_base, abs=2e-4)  # base is still served as is
    # one optimizer step moved the served distribution
    assert max(abs(a - b) for a, b in zip(tuned.logprobs, untuned, strict=True)) > 0.1

    with pytest.raises(PolicyServerError, match="already been loaded") as err:
        client.load_adapter("cap", str(second))
    assert err.value.status == 400
    client.load_adapter("cap", str(second), load_inplace=True)  # the per-step hot swap
    swapped = client.chat(ASK, model="cap", max_tokens=6, temperature=0)[0]
    ref2 = teacher_forced_logprobs(PeftModel.from_pretrained(
        models.load_model(str(tool_model))[0], str(second)), swapped.prompt_token_ids,
        swapped.token_ids)
    assert swapped.logprobs == pytest.approx(ref2, abs=2e-4)

    client.unload_adapter("cap")
    with pytest.raises(PolicyServerError, match="does not exist") as err:
        client.chat(ASK, model="cap", max_tokens=2)
    assert err.value.status == 404
    with pytest.raises(PolicyServerError, match="cannot be found"):
        client.unload_adapter("cap")
    with pytest.raises(PolicyServerError, match="No adapter found") as err:
        client.load_adapter("ghost", str(tmp_path / "nowhere"))
    assert err.value.status == 404
    with pytest.raises(PolicyServerError, match="conflicts with a served base model"):
        client.load_adapter("tiny-tools", str(first))


@pytest.mark.parametrize("body,status,needle", [
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": []}, 400, "non-empty list"),
    ({"messages": ASK, "stream": True}, 400, "streaming is not supported"),
    ({"messages": ASK, "top_logprobs": 2}, 400, "requires logprobs"),
    ({"messages": ASK, "n": 0}, 400, "n: expected an integer"),
    ({"messages": ASK, "n": 2, "temperature": 0}, 400, "n must be 1 when using greedy"),
    ({"messages": ASK, "temperature": 9}, 400, "temperature"),
    ({"messages": ASK, "max_tokens": "lots"}, 400, "max_tokens"),
    ({"messages": ASK, "tools": TOOLS, "tool_choice": "required"}, 400, "tool_choice"),
    ({"messages": ASK, "tools": [{"type": "function"}]}, 400, "tools: expected"),
    ({"messages": ASK, "model": "gpt-9"}, 404, "does not exist"),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "maximum context length"),
])
def test_bad_requests_get_openai_shaped_errors(server, body, status, needle):
    resp = httpx.post(server.base_url + "/chat/completions", json=body)
    assert resp.status_code == status
    err = resp.json()["error"]
    assert needle in err["message"] and err["code"] == status


def test_non_json_body_is_refused(server):
    resp = httpx.post(server.base_url + "/chat/completions", content=b"{nope",
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_client_satisfies_the_protocol(client):
    assert isinstance(client, PolicyClient)


def test_cli_serve_runs_a_server_process(tool_model, tmp_path):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trace_lib", "serve", "--model", str(tool_model), "--port",
         str(port), "--served-model-name", "cli-tiny", "--threads", "1", "--max-n", "2",
         "--max-body-bytes", "20000", "--kv-cache-mb", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        with OpenAIPolicyClient(base) as c:
            c.wait_until_ready(timeout=120, process=proc)
            assert c.models() == ["cli-tiny"]
            comp = c.chat(ASK, tools=TOOLS, temperature=0, max_tokens=64)[0]
            assert comp.tool_calls[0]["function"]["name"] == "get_user"
        # the limits given on the command line are the server's
        resp = httpx.post(base + "/chat/completions",
                          json={"messages": ASK, "n": 3, "max_tokens": 1})
        assert resp.status_code == 400 and "n: expected an integer in [1, 2]" in \
            resp.json()["error"]["message"]
        resp = httpx.post(base + "/chat/completions",
                          json={"messages": ASK, "junk": "x" * 20_000, "max_tokens": 1})
        assert resp.status_code == 413 and "larger than 20000 bytes" in \
            resp.json()["error"]["message"]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert (f"serving cli-tiny on http://127.0.0.1:{port}/v1 (n <= 2, bodies <= 20000 bytes, "
            "KV cache 0 MB)") in out.decode()


def test_cli_serve_refuses_bad_limits():
    for flag, value in (("--max-n", "0"), ("--kv-cache-mb", "-1"), ("--max-body-bytes", "x")):
        proc = subprocess.run([sys.executable, "-m", "trace_lib", "serve", flag, value],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and f"argument {flag}: expected an integer" in proc.stderr


def test_seeded_requests_batch_together_and_sample_as_if_alone(server, tool_model):
    """Seeded requests share one decode (per-row generators), yet each gets exactly the
    tokens it gets alone: prompts of different lengths (left padding), different n, and an
    unseeded request mixed in."""
    from trace_lib.runtime.policy_engine import SamplingParams

    engine = server.service.engine
    prompts = [server.service.parse_request(
        {"model": "tiny-tools", "messages": [{"role": "user", "content": text}]})[0]
        for text in ["hi", "tell me about user u1 please", "the user id is u1"]]
    assert len({len(p) for p in prompts}) == 3  # different lengths: left padding differs
    jobs = [(prompts[0], 3, 11), (prompts[1], 2, 12), (prompts[2], 1, 13), (prompts[1], 2, 11)]

    def params(seed):
        return SamplingParams(temperature=1.0, max_tokens=12, seed=seed)

    alone = []
    for prompt, n, seed in jobs:
        alone.append([s.token_ids for s in engine.submit(prompt, n, params(seed), None).result()])
    engine.batch_log.clear()
    # Held admission: everything submitted inside is admitted together, as one cohort.
    with engine.held():
        futures = [engine.submit(prompt, n, params(seed), None) for prompt, n, seed in jobs]
        futures.append(engine.submit(prompts[0], 2, params(None), None))  # unseeded
    batched = [[s.token_ids for s in f.result()] for f in futures]
    assert (len(jobs) + 1, 10) in engine.batch_log, engine.batch_log  # all in one decode
    assert batched[:len(jobs)] == alone
    # Same seed and prompt inside one batch: identical rows, as two separate calls would be.
    again = engine.submit(prompts[1], 2, params(11), None)
    twin = engine.submit(prompts[1], 2, params(11), None)
    assert [s.token_ids for s in again.result()] == [s.token_ids for s in twin.result()]


# ------------------------------------------------------------------ load and abuse (issue 16)


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    """Poll state the server exposes until `predicate()` is truthy (never a fixed sleep)."""
    import time

    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def raw_post(server, path: str, body: bytes, content_type: str = "application/json",
             length: int | None = None):
    """An HTTP/1.1 POST on a plain socket, left open: the caller reads or hangs up."""
    import socket

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    head = (f"POST /v1{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def long_request(server) -> bytes:
    """A request that would decode (ignore_eos) almost the whole context."""
    return json.dumps({"model": "tiny-tools", "messages": ASK, "ignore_eos": True,
                       "max_tokens": server.service.max_model_len - 64,
                       "temperature": 1.0}).encode()


def test_max_tokens_is_capped_by_the_context_like_vllm(server, client):
    limit = server.service.max_model_len
    too_many = httpx.post(server.base_url + "/chat/completions",
                          json={"messages": ASK, "max_tokens": 2 ** 20})
    assert too_many.status_code == 400
    assert (f"max_tokens=1048576 cannot be greater than max_model_len={limit}"
            in too_many.json()["error"]["message"])
    prompt = client.chat(ASK, max_tokens=1)[0].prompt_token_ids
    over = httpx.post(server.base_url + "/chat/completions",
                      json={"messages": ASK, "max_completion_tokens": limit - len(prompt) + 1})
    err = over.json()["error"]
    assert over.status_code == 400 and err["param"] == "max_completion_tokens"
    assert (f"maximum context length is {limit} tokens. However, you requested {limit + 1} "
            f"tokens ({len(prompt)} in the messages") in err["message"]
    # exactly filling the context is allowed
    parsed = server.service.parse_request({"messages": ASK, "max_tokens": limit - len(prompt)})
    assert parsed[2].max_tokens == limit - len(prompt)


def test_n_and_body_size_are_capped(server):
    cap = server.service.max_n
    resp = httpx.post(server.base_url + "/chat/completions",
                      json={"messages": ASK, "n": cap + 1, "max_tokens": 1})
    assert resp.status_code == 400 and f"n: expected an integer in [1, {cap}]" in \
        resp.json()["error"]["message"]
    limit = server.service.max_body_bytes
    # Declared too large: refused from the header, before the body is read.
    sock = raw_post(server, "/chat/completions", b"{", length=50_000_000)
    reply = b""
    try:
        while f"larger than {limit} bytes".encode() not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 413") and f"larger than {limit} bytes".encode() in reply
    # Streamed without a length (chunked): refused once the cap is crossed.
    pad = json.dumps({"messages": ASK, "junk": "x" * (limit + 10)}).encode()
    chunks = (pad[i:i + 65536] for i in range(0, len(pad), 65536))
    resp = httpx.post(server.base_url + "/chat/completions", content=chunks,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"]["code"] == 413
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("path,body", [
    ("/chat/completions", {"messages": ASK, "max_tokens": 1}),
    ("/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
    ("/unload_lora_adapter", {"lora_name": "x"}),
])
@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", None])
def test_post_endpoints_take_only_json(server, path, body, ctype):
    """A web page can POST text/plain, a form or multipart cross-site without a CORS
    preflight; only application/json (which needs one) is accepted."""
    headers = {"content-type": ctype} if ctype else {}
    resp = httpx.post(server.base_url + path, content=json.dumps(body).encode(),
                      headers=headers)
    assert resp.status_code == 415, resp.text
    assert "expected Content-Type application/json" in resp.json()["error"]["message"]
    ok = httpx.post(server.base_url + "/chat/completions", content=json.dumps(
        {"messages": ASK, "max_tokens": 1}).encode(),
        headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_a_client_that_hangs_up_stops_its_generation(server):
    engine = server.service.engine
    wait_for(lambda: not engine.running(), what="an idle engine")
    cancelled = engine.stats["cancelled"]
    body = long_request(server)
    sock = raw_post(server, "/chat/completions", body)
    job = wait_for(lambda: [j for j in engine.running() if j["generated"] >= 3],
                   what="the long request to decode")[0]
    sock.close()  # the client goes away mid-generation
    wait_for(lambda: not engine.running(), what="the abandoned request to stop")
    assert engine.stats["cancelled"] == cancelled + 1
    # It stopped long before its max_tokens: ask the engine how far it got.
    assert job["max_tokens"] > 1000
    assert httpx.get(server.url + "/health").status_code == 200


def test_one_long_request_does_not_starve_short_ones(server, client):
    """Decode steps interleave: short requests finish while a long one is mid-way."""
    engine = server.service.engine
    wait_for(lambda: not engine.running(), what="an idle engine")
    sock = raw_post(server, "/chat/completions", long_request(server))
    try:
        wait_for(lambda: [j for j in engine.running() if j["generated"] >= 3],
                 what="the long request to decode")
        for _ in range(3):  # each finishes although the long one holds the engine
            short = client.chat([{"role": "user", "content": "hi"}], max_tokens=4,
                                temperature=0.7)
            assert 1 <= len(short[0].token_ids) <= 4
        still = [j for j in engine.running() if j["max_tokens"] > 1000]
        assert still and still[0]["generated"] < still[0]["max_tokens"]
    finally:
        sock.close()
    wait_for(lambda: not engine.running(), what="the long request to be cancelled")


def test_a_port_in_use_is_a_clear_error(tool_model):
    import socket

    from trace_lib.errors import UserInputError

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(UserInputError, match=f"cannot serve on 127.0.0.1:{port}"):
            PolicyServer(ServerConfig(model=str(tool_model), port=port)).start()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "trace_lib", "serve", "--model", str(tool_model), "--port",
             str(port)], capture_output=True, text=True, env=env, timeout=120)
    finally:
        holder.close()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "serving" not in proc.stdout
    assert f"cannot serve on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
