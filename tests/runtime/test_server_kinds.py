"""Server kinds: `make_policy_server` picks a kind from `SERVER_KINDS` and hands back a
server not yet started, with the addresses a job's client needs."""

from __future__ import annotations

import pytest

from trace_lib.errors import UserInputError
from trace_lib.runtime.policy_server import PolicyServer
from trace_lib.runtime.server_kinds import SERVER_KINDS, ServerHandle, make_policy_server


def test_the_built_in_kinds_in_their_order():
    assert SERVER_KINDS.names() == ["ours", "vllm"]
    assert SERVER_KINDS.target("vllm") == "trace_lib.runtime.vllm_server:server_for"


def test_ours_is_our_server_not_started():
    server = make_policy_server("ours", "tiny", served_model_name="tiny-served")
    assert isinstance(server, PolicyServer) and isinstance(server, ServerHandle)
    assert server.service is None  # not started: nothing loaded, no port bound
    assert server.model_name == "tiny-served" and server.config.model == "tiny"


def test_vllm_without_its_interpreter_says_how_to_build_it(tmp_path):
    with pytest.raises(UserInputError, match=r"server vllm: no vLLM interpreter at .*nope; "
                                             r"build it with `make vllm-venv`"):
        make_policy_server("vllm", "tiny", vllm_python=str(tmp_path / "nope"))


def test_vllm_gets_the_request_as_launch_flags(tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    server = make_policy_server("vllm", str(model), served_model_name="m", max_lora_rank=24,
                                log_path=str(tmp_path / "log"), vllm_python=str(python))
    cmd = server.config.command()
    assert cmd[:2] == [str(python), "-m"] and cmd[cmd.index("--model") + 1] == str(model)
    assert cmd[cmd.index("--max-lora-rank") + 1] == "32"  # a power of two, as vLLM takes
    assert cmd[cmd.index("--dtype") + 1] == "float32" and server.model_name == "m"
    assert server.process is None  # not started


def test_vllm_cpu_engine_gets_every_core_unless_the_caller_binds(tmp_path, monkeypatch):
    import os

    python = tmp_path / "python"
    python.write_text("")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    server = make_policy_server("vllm", str(model), vllm_python=str(python))
    every = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert server.config.environment()["VLLM_CPU_OMP_THREADS_BIND"] == every
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")  # the caller's choice wins
    assert server.config.environment()["VLLM_CPU_OMP_THREADS_BIND"] == "0"
