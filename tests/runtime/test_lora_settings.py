"""LoRA settings live with the LoRA code (runtime.lora) and the training config nests the same
class; reading or checking settings imports neither torch nor peft."""

from __future__ import annotations

import subprocess
import sys

from trace_lib.runtime import lora
from trace_lib.train import config


def test_one_settings_class():
    assert config.LoraSettings is lora.LoraSettings
    assert config.TrainConfig.from_dict({"env": "x", "lora": {"rank": 4}}).lora == \
        lora.LoraSettings(rank=4)
    assert lora.LoraSettings().targets == list(lora.DEFAULT_TARGETS)


def test_settings_import_no_torch_or_peft():
    code = ("import sys; import trace_lib.train.config, trace_lib.runtime.lora; "
            "print(sorted(m for m in ('torch', 'peft', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"
