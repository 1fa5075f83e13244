"""The command line and environment `VLLMConfig` builds (no vLLM needed): the training
loop's flags by default, and a serving-only engine (the labeler's bench) without LoRA or
a tool parser."""

from __future__ import annotations

import pytest

from trace_lib.runtime.vllm_server import VLLMConfig

LORA_FLAGS = ("--enable-lora", "--max-lora-rank", "--max-loras")
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser")


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_the_training_loops_engine_gets_lora_and_the_tool_parser(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    cfg = VLLMConfig(model="/m", python="/py", port=8123, max_lora_rank=32, max_loras=2)
    cmd = cfg.command()
    assert cmd[:5] == ["/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert all(f in cmd for f in LORA_FLAGS + TOOL_FLAGS)
    assert (_flag(cmd, "--max-lora-rank"), _flag(cmd, "--max-loras")) == ("32", "2")
    assert _flag(cmd, "--tool-call-parser") == "hermes"
    assert _flag(cmd, "--logprobs-mode") == "processed_logprobs"
    assert _flag(cmd, "--port") == "8123"
    assert cfg.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_a_serving_only_engine_asks_for_neither_lora_nor_tools(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    cfg = VLLMConfig(model="/m", python="/py", lora=False, tool_call_parser=None,
                     served_model_name="s", max_model_len=8192, cpu_kv_cache_gib=2,
                     cpu_omp_bind="0,1", extra_args=["--max-num-seqs", "8"])
    cmd = cfg.command()
    assert not any(f in cmd for f in LORA_FLAGS + TOOL_FLAGS)
    assert (_flag(cmd, "--served-model-name"), _flag(cmd, "--max-model-len")) == ("s", "8192")
    assert cmd[-2:] == ["--max-num-seqs", "8"]  # the caller's own flags come last
    env = cfg.environment()
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env
    assert (env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_CPU_OMP_THREADS_BIND"]) == ("2", "0,1")
