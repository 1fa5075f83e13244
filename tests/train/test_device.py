"""Where the trained model runs: `TrainConfig.device` / `dtype`, resolved once.

The CUDA tests run where torch sees a GPU (the device check of bench/README.md's "Training
on a GPU" section ran them on an H200); here they are skipped, and the rules that decide
the device and the dtype are tested on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from toy_training import TOY

from trace_lib.errors import UserInputError
from trace_lib.runtime.base_models import resolve_device, resolve_dtype
from trace_lib.train.trainer import TrainConfig, train

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_auto_is_the_gpu_when_there_is_one_else_the_cpu():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"
    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype("auto", "cuda:0") is torch.bfloat16
    assert resolve_dtype("float32", "cuda") is torch.float32


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_that_is_not_there_is_a_clear_error():
    with pytest.raises(UserInputError, match="sees no CUDA GPU.*--device cpu"):
        resolve_device("cuda")


@pytest.mark.parametrize(("patch", "field"), [({"device": "tpu"}, "device"),
                                              ({"device": "cuda:first"}, "device"),
                                              ({"dtype": "float16"}, "dtype")])
def test_device_and_dtype_errors_name_the_field(patch, field):
    with pytest.raises(UserInputError, match=f"`{field}`"):
        TrainConfig.from_dict({**TOY, **patch}, where="spec.json: config")


def test_the_cli_flags_reach_the_config():
    from trace_lib.cli import build_parser
    from trace_lib.cli.train import config_from_args

    args = build_parser().parse_args(["train", "--env", "airline/tool_calling_precision",
                                      "--device", "cpu", "--dtype", "bfloat16"])
    cfg = config_from_args(args)
    assert (cfg["device"], cfg["dtype"]) == ("cpu", "bfloat16")


@cuda
def test_training_on_the_gpu_learns_and_the_cpu_server_serves_its_adapter(tmp_path):
    # float32 on the GPU: the CPU policy server samples from the very adapter trained there,
    # so the sampler's log-probs and the loss's agree (bf16 would add rounding to the gap).
    cfg = TrainConfig.from_dict({**TOY, "steps": 12, "device": "cuda", "dtype": "float32",
                                 "sft_steps": 2})
    result = train(cfg, tmp_path / "run", resume=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = sum(r["reward_mean"] for r in rows[:4]) / 4
    last = sum(r["reward_mean"] for r in rows[-4:]) / 4
    assert last > first + 0.1, (first, last)
    assert max(r["sampler_logprob_gap"] for r in rows) < 1e-3
    weights = load_file(f"{result.adapter_path}/adapter_model.safetensors")
    assert all(w.device.type == "cpu" and torch.isfinite(w).all() for w in weights.values())


@cuda
def test_bf16_on_the_gpu_keeps_the_lora_in_float32(tmp_path):
    cfg = TrainConfig.from_dict({**TOY, "steps": 2, "device": "cuda"})
    result = train(cfg, tmp_path / "run", resume=False)
    weights = load_file(f"{result.adapter_path}/adapter_model.safetensors")
    # The LoRA factors only: with `lm_head` among the targets peft also saves the base
    # output layer (`save_embedding_layers`), and that one is in the base's bf16.
    assert {w.dtype for k, w in weights.items() if "lora_" in k} == {torch.float32}
    assert any("lora_" in k for k in weights)
