"""The GRPO loop end to end: real tiny model, real CPU policy server, real environments.

Reward rising, checkpoint/resume equivalence, KL/epochs/hints paths, config errors.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from toy_training import TOY

from trace_lib.errors import UserInputError  # noqa: E402
from trace_lib.train.trainer import (  # noqa: E402
    TrainConfig,
    latest_checkpoint,
    train,
    write_checkpoint,
)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_reward_rises_on_toy_environment(tmp_path):
    cfg = TrainConfig.from_dict({**TOY, "steps": 12, "eval_seeds": 4})
    result = train(cfg, tmp_path / "run", resume=False)
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 13))
    first = sum(r["reward_mean"] for r in rows[:4]) / 4
    last = sum(r["reward_mean"] for r in rows[-4:]) / 4
    assert last > first + 0.1, (first, last)
    # The server ran exactly the weights we trained (same forward, same precision).
    assert max(r["sampler_logprob_gap"] for r in rows) < 1e-4
    for key in ("reward_std", "pass_rate", "loss", "clip_fraction", "kl", "tokens_per_s",
                "rollouts_per_s", "wall_s"):
        assert all(key in r for r in rows)
    assert result.final_reward == rows[-1]["reward_mean"]
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 12 * 2  # one transcript per group per step
    assert samples[-1]["messages"][-1]["role"] == "assistant" and "reward" in samples[-1]
    assert result.eval_before["n"] == 4 and result.eval_after["n"] == 4
    adapter = Path(result.adapter_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8 and Path(config["base_model_name_or_path"]).is_dir()
    assert (adapter / "adapter_model.safetensors").exists()


def test_resume_from_checkpoint_equals_running_through(tmp_path):
    base = {**TOY, "group": 4, "groups_per_step": 1, "checkpoint_every": 2}
    through = train(TrainConfig.from_dict({**base, "steps": 4}), tmp_path / "a", resume=False)
    # Same run, stopped after step 2 (its checkpoint), then resumed to step 4.
    train(TrainConfig.from_dict({**base, "steps": 2}), tmp_path / "b", resume=False)
    assert latest_checkpoint(tmp_path / "b").name == "step_2"
    resumed = train(TrainConfig.from_dict({**base, "steps": 4}), tmp_path / "b", resume=True)
    wa = load_file(str(Path(through.adapter_path) / "adapter_model.safetensors"))
    wb = load_file(str(Path(resumed.adapter_path) / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k
    ra, rb = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    assert [r["reward_mean"] for r in ra] == [r["reward_mean"] for r in rb]
    assert [round(r["loss"], 6) for r in ra] == [round(r["loss"], 6) for r in rb]


def test_kl_epochs_and_hints_paths(tmp_path):
    cfg = TrainConfig.from_dict({
        **TOY, "steps": 2, "group": 4, "groups_per_step": 2, "epochs_per_step": 2,
        "hint_share": 0.5, "micro_batch": 3, "gradient_checkpointing": True, "loss": {"kl_coef": 0.1, "scale": "batch"},
    })
    train(cfg, tmp_path / "run", resume=False)
    rows = _metrics(tmp_path / "run")
    assert len(rows) == 2
    kept = [r for r in rows if r["groups_kept"]]
    assert kept, "expected at least one informative group"
    # The second epoch runs on moved weights: KL against the base is positive there.
    assert any(r["kl"] > 0 for r in kept)
    assert all(0.0 <= r["clip_fraction"] <= 1.0 for r in rows)


@pytest.mark.parametrize(
    ("patch", "field"),
    [({"group": 1}, "group"), ({"hint_share": 2.0}, "hint_share"), ({"bogus": 1}, "bogus"),
     ({"loss": {"scale": "weird"}}, "loss.scale"), ({"lora": {"rnk": 4}}, "rnk")],
)
def test_config_errors_name_the_field(patch, field):
    with pytest.raises(UserInputError, match=field):
        TrainConfig.from_dict({**TOY, **patch}, where="spec.json: config")


def test_warm_started_adapter_is_what_step_one_samples(tmp_path):
    """After an SFT warm start, or from `init_adapter`, step 1's rollouts come from the
    adapter the trainer holds (published as `<run>-s0`), not from the base model: the
    server's log-probs of the sampled tokens equal the trainer's."""
    sft = train(TrainConfig.from_dict({**TOY, "steps": 1, "group": 4, "sft_steps": 3,
                                       "sft_seeds": 4, "lr": 1e-6}), tmp_path / "sft",
                resume=False)
    assert len((tmp_path / "sft" / "sft.jsonl").read_text().splitlines()) == 3
    first = _metrics(tmp_path / "sft")[0]
    assert first["policy"] == "sft-s0"
    assert first["sampler_logprob_gap"] < 1e-4  # the base would be far off the SFT weights
    cont = train(TrainConfig.from_dict({**TOY, "steps": 2, "group": 4, "lr": 1e-6,
                                        "init_adapter": sft.adapter_path}),
                 tmp_path / "cont", resume=False)
    rows = _metrics(tmp_path / "cont")
    assert [r["policy"] for r in rows] == ["cont-s0", "cont-s1"]
    assert max(r["sampler_logprob_gap"] for r in rows) < 1e-4
    start = load_file(str(Path(sft.adapter_path) / "adapter_model.safetensors"))
    end = load_file(str(Path(cont.adapter_path) / "adapter_model.safetensors"))
    # two steps at lr 1e-6 from the SFT adapter stay next to it (a zero start would not)
    assert max((start[k] - end[k]).abs().max().item() for k in start) < 1e-3
    plain = train(TrainConfig.from_dict({**TOY, "steps": 1, "group": 4}), tmp_path / "plain",
                  resume=False)
    assert _metrics(Path(plain.run_dir))[0]["policy"] != "plain-s0"  # zero adapter: the base


def test_init_adapter_errors_name_the_field_and_the_shape(tmp_path):
    with pytest.raises(UserInputError, match="init_adapter.*adapter folder"):
        TrainConfig.from_dict({**TOY, "init_adapter": str(tmp_path / "nowhere")})
    first = train(TrainConfig.from_dict({**TOY, "steps": 1, "group": 2}), tmp_path / "r",
                  resume=False)
    with pytest.raises(UserInputError, match="rank=8.*rank=4"):
        TrainConfig.from_dict({**TOY, "init_adapter": first.adapter_path,
                               "lora": {**TOY["lora"], "rank": 4}})
    with pytest.raises(UserInputError, match="distractors"):
        TrainConfig.from_dict({**TOY, "distractors": -1})


def test_unknown_environment_is_a_clear_error(tmp_path):
    cfg = TrainConfig.from_dict({**TOY, "env": "no_such_module:Env", "steps": 1})
    with pytest.raises(UserInputError, match="no_such_module"):
        train(cfg, tmp_path / "run")


def test_a_checkpoint_interrupted_while_written_leaves_no_step_folder(tmp_path):
    """A save that dies half way (here: its trainer state cannot be serialised, after the
    adapter files were written) leaves no `step_*` folder, so nothing lists or resumes from
    half a checkpoint; the next save of that step is whole."""
    from trace_lib.runtime.base_models import load_model
    from trace_lib.runtime.lora import attach_lora
    from trace_lib.train.config import LoraSettings

    base, _ = load_model("tiny")
    model = attach_lora(base, LoraSettings(rank=4, alpha=4, targets=["q_proj", "v_proj"]))
    first = write_checkpoint(tmp_path, 1, model, "tiny", {"step": 1})
    with pytest.raises(Exception):  # noqa: B017 - whatever pickling raises
        write_checkpoint(tmp_path, 2, model, "tiny", {"step": 2, "bad": lambda: None})
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_1"]
    assert latest_checkpoint(tmp_path) == first
    second = write_checkpoint(tmp_path, 2, model, "tiny", {"step": 2})
    assert latest_checkpoint(tmp_path) == second
    assert load_file(str(second / "adapter_model.safetensors"))
    assert torch.load(second / "trainer_state.pt")["step"] == 2
    assert not list((tmp_path / "checkpoints").glob(".partial-*"))


def test_a_turn_budget_below_the_reference_call_is_said(capsys):
    """airline/tool_calling_precision's passenger-list call does not fit in 16 tokens: the
    trainer says so before any step, with the length it measured; a budget that holds the
    longest reference turn says nothing; no budget at all is derived from that turn (issue
    30: the fixed default of 64 could not hold it)."""
    from trace_lib.envs.capabilities import make_capability_env
    from trace_lib.runtime.base_models import load_tokenizer, resolve_model
    from trace_lib.train.local_rollouts import derived_max_tokens, longest_reference_turn
    from trace_lib.train.trainer import turn_budget

    def make_env():
        return make_capability_env("airline", "tool_calling_precision", difficulty=1,
                                   tools="capability", policy="excerpt", distractors=0)

    tok = load_tokenizer(resolve_model("tiny"))
    longest = longest_reference_turn(make_env(), range(4), tok, max_turns=2)
    assert longest > 40  # a JSON call with a nested passenger list
    cfg = TrainConfig(env="airline/tool_calling_precision", model="tiny", max_tokens=16,
                      max_turns=2)
    assert turn_budget(cfg, make_env, tok) == 16
    out = capsys.readouterr().out
    assert "warning: --max-tokens 16 is below" in out and f"({longest} tokens" in out
    assert f"use --max-tokens {derived_max_tokens(longest)}" in out
    assert turn_budget(dataclasses.replace(cfg, max_tokens=longest), make_env, tok) == longest
    assert capsys.readouterr().out == ""
    derived = turn_budget(dataclasses.replace(cfg, max_tokens=None), make_env, tok)
    assert derived == derived_max_tokens(longest) and derived % 32 == 0
    assert longest * 1.25 <= derived < longest * 1.25 + 32
    out = capsys.readouterr().out
    assert f"--max-tokens {derived}: from the longest reference turn" in out
    assert TrainConfig(env="x").max_tokens is None
    assert derived_max_tokens(0) == 64 and derived_max_tokens(10) == 64


def test_zero_grpo_steps_is_sft_alone_and_needs_sft(tmp_path):
    """`steps` 0 with `sft_steps` is the SFT-only baseline: the warm start is the adapter,
    no rollout runs (no metrics row, no server); 0 steps without SFT is refused."""
    with pytest.raises(UserInputError, match=r"steps.*0 only with sft_steps >= 1"):
        TrainConfig.from_dict({**TOY, "steps": 0})
    result = train(TrainConfig.from_dict({**TOY, "steps": 0, "sft_steps": 3, "sft_seeds": 4}),
                   tmp_path / "sft_only", resume=False)
    assert result.steps == 0 and result.final_reward is None
    assert len((tmp_path / "sft_only" / "sft.jsonl").read_text().splitlines()) == 3
    assert not (tmp_path / "sft_only" / "metrics.jsonl").exists()
    weights = load_file(str(Path(result.adapter_path) / "adapter_model.safetensors"))
    # LoRA's B starts at zero: a nonzero B is the SFT's update, saved as the adapter
    assert any(k.endswith("lora_B.weight") and v.abs().max().item() > 0
               for k, v in weights.items())
    # SFT scores the demos' shared prompt without gradient (PrefixForward), except under
    # gradient checkpointing, whose recompute would extend that prompt's KV cache twice:
    # there the whole sequence is scored. Step 1's loss is the same either way.
    checkpointed = train(TrainConfig.from_dict({**TOY, "steps": 0, "sft_steps": 3,
                                                "sft_seeds": 4, "gradient_checkpointing": True}),
                         tmp_path / "sft_gc", resume=False)
    first = [json.loads((tmp_path / run / "sft.jsonl").read_text().splitlines()[0])["loss"]
             for run in ("sft_only", "sft_gc")]
    assert checkpointed.steps == 0 and first[0] == pytest.approx(first[1], abs=1e-5)


def test_bf16_autocast_trains_in_bf16_matmuls_over_float32_weights(tmp_path, capsys):
    """`autocast` "bf16": the SFT and GRPO passes run under bf16 autocast (the losses move
    off the float32 run's, within bf16's rounding), the trained weights and the adapter
    stay float32, and a precision the trainer does not know is refused by name."""
    with pytest.raises(UserInputError, match=r"autocast.*'fp16'.*off or bf16"):
        TrainConfig.from_dict({**TOY, "autocast": "fp16"})
    runs = {}
    for mode in ("off", "bf16"):
        cfg = TrainConfig.from_dict({**TOY, "steps": 1, "sft_steps": 2, "sft_seeds": 4,
                                     "autocast": mode})
        result = train(cfg, tmp_path / mode, resume=False)
        sft_losses = [json.loads(x)["loss"] for x in
                      (tmp_path / mode / "sft.jsonl").read_text().splitlines()]
        runs[mode] = (result, sft_losses, _metrics(tmp_path / mode))
    assert "bf16 autocast" in capsys.readouterr().out
    (_, fp32, _), (result, bf16, rows) = runs["off"], runs["bf16"]
    assert bf16 != fp32  # the matmuls really ran in bf16
    assert bf16 == pytest.approx(fp32, rel=0.05)
    assert len(rows) == 1 and rows[0]["loss"] == rows[0]["loss"]  # a GRPO step, finite
    weights = load_file(str(Path(result.adapter_path) / "adapter_model.safetensors"))
    assert {v.dtype for v in weights.values()} == {torch.float32}


def test_a_killed_sft_warm_start_resumes_from_its_checkpoint(tmp_path, capsys):
    """The warm start checkpoints every `checkpoint_every` steps and a rerun in the same
    folder continues from there with the batches an uninterrupted run draws: the same
    losses and the same adapter as one run straight through (no LoRA dropout here)."""
    sft_only = {**TOY, "steps": 0, "sft_seeds": 4, "checkpoint_every": 2}
    straight = train(TrainConfig.from_dict({**sft_only, "sft_steps": 4}), tmp_path / "a",
                     resume=True)
    # the same run stopped after its step-2 checkpoint, then run again to 4 steps
    train(TrainConfig.from_dict({**sft_only, "sft_steps": 2}), tmp_path / "b", resume=True)
    assert (tmp_path / "b" / "sft_state.pt").is_file()
    capsys.readouterr()
    resumed = train(TrainConfig.from_dict({**sft_only, "sft_steps": 4}), tmp_path / "b",
                    resume=True)
    out = capsys.readouterr().out
    assert "SFT warm start resumed at step 2/4" in out
    assert "SFT step 1/4" not in out and "SFT step 3/4" in out  # steps 1-2 not trained again

    def losses(run: str) -> list[float]:
        return [json.loads(x)["loss"] for x in (tmp_path / run / "sft.jsonl").read_text()
                .splitlines()]

    assert losses("b") == pytest.approx(losses("a"), abs=1e-6)
    a = load_file(str(Path(straight.adapter_path) / "adapter_model.safetensors"))
    b = load_file(str(Path(resumed.adapter_path) / "adapter_model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    # resume=False starts over: the checkpoint is not trusted
    capsys.readouterr()
    train(TrainConfig.from_dict({**sft_only, "sft_steps": 2}), tmp_path / "b", resume=False)
    assert "resumed" not in capsys.readouterr().out
