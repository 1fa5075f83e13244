"""The smoke training config the trainer tests share (imported by name; see conftest.py).

The `tiny` model ties its output layer to embeddings initialised with std 0.02, so LoRA
on the blocks alone can move a next-token log-prob only from about -6.9 to -5.6; adding
`lm_head` to the targets lets a few steps visibly change behaviour.

`device: cpu`: tests compare the sampler's log-probs with the loss's to 1e-4, which holds
when both run the same fp32 weights; on a GPU box `auto` would train in bf16 on CUDA
against the fp32 CPU server (gap ~1e-2, measured on an H200). The CUDA tests of
tests/train/test_device.py set the device themselves.
"""

TOY = {
    "env": "trace_lib.train.smoke_envs:TargetLetterEnv", "model": "tiny", "device": "cpu",
    "group": 8, "groups_per_step": 2, "max_tokens": 3, "lr": 2e-2, "checkpoint_every": 0,
    "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj", "lm_head"]},
}
