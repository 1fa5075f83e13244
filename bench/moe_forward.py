"""Forward latency and memory of the top-1 gated model vs the base, the dense reference and
peft's X-LoRA over the same adapters, measured side by side on this machine.

    python bench/moe_forward.py                  # SmolLM2-135M shape, K=4, r=16, CPU
    python bench/moe_forward.py --layers 4 --tokens 64 --repeats 3   # quick
    python bench/moe_forward.py --device cuda --hidden 2048 --layers 24 ...  (bench/gpu_moe.sh)

Design decisions
- Same random-init base (the SmolLM2-135M shape by default: no download), same K PEFT
  adapters written by peft itself with random non-zero B, same token ids for every variant.
- Gates are random (std 1), not zero: zero gates route everything to the base and the
  top-1 model would trivially cost what the base costs. Random gates spread the tokens
  over all K+1 slots, the worst case for dispatch overhead.
- Each variant runs in its own subprocess, so peak RSS (CPU) or peak allocated (CUDA) is
  that variant's alone; latency is the median of `--repeats` timed forwards after warm-up.
- Prefill: one forward over B x T tokens. Decode: ms per generated token (greedy, KV cache)
  for the variants that support it; X-LoRA's two-pass scaling is timed on prefill only.
- The goal: top-1 within 1.3x of the base at K=4 (the floor is the base plus one low-rank
  product per token).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("base", "top1", "dense", "xlora")


def _build(args: argparse.Namespace, root: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                         tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(root / "base"))
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for k in range(args.experts):
        torch.manual_seed(100 + k)
        model = LlamaForCausalLM(config)
        peft_model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.rank,
                                                      target_modules=targets,
                                                      task_type="CAUSAL_LM"))
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
        peft_model.save_pretrained(str(root / f"adapter{k}"))


def _measure(variant: str, args: argparse.Namespace, root: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(root / "base"), dtype=dtype).to(device).eval()
    adapters = [root / f"adapter{k}" for k in range(args.experts)]
    runner = model
    if variant in ("top1", "dense"):
        from trace_lib.compose.adapters import read_adapters
        from trace_lib.compose.gated import GatedMoE, MoEConfig

        moe = GatedMoE(model, read_adapters([(f"c{k}", p) for k, p in enumerate(adapters)]),
                       MoEConfig("top1", dispatch="sparse" if variant == "top1" else "dense"))
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for gate in moe.gates:
                gate.weight.copy_(torch.randn(gate.weight.shape, generator=g))
                gate.bias.copy_(torch.randn(gate.bias.shape, generator=g))
    elif variant == "xlora":
        from peft import XLoraConfig, get_peft_model

        model.config.use_cache = False
        runner = get_peft_model(model, XLoraConfig(
            task_type="CAUSAL_LM", hidden_size=args.hidden, xlora_depth=1,
            adapters={str(k): str(p) for k, p in enumerate(adapters)})).to(device).eval()
    ids = torch.randint(10, args.vocab - 1, (args.batch, args.tokens),
                        generator=torch.Generator().manual_seed(1)).to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    times = []
    with torch.no_grad():
        for i in range(args.repeats + 1):
            sync()
            t0 = time.perf_counter()
            runner(input_ids=ids, use_cache=False)
            sync()
            if i:  # the first is warm-up
                times.append(time.perf_counter() - t0)
        decode_ms = None
        if variant != "xlora" and args.decode_tokens > 0:
            one = ids[:1, :32]
            kw = dict(max_new_tokens=args.decode_tokens, min_new_tokens=args.decode_tokens,
                      do_sample=False, pad_token_id=0)
            runner.generate(input_ids=one, attention_mask=torch.ones_like(one), **kw)
            sync()
            t0 = time.perf_counter()
            runner.generate(input_ids=one, attention_mask=torch.ones_like(one), **kw)
            sync()
            decode_ms = (time.perf_counter() - t0) / args.decode_tokens * 1000
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"variant": variant, "prefill_ms": statistics.median(times) * 1000,
            "decode_ms_per_token": decode_ms, "peak_mib": peak}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--workdir", default=None, help="reuse a folder with the built models")
    p.add_argument("--_variant", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args._variant:
        print(json.dumps(_measure(args._variant, args, Path(args.workdir))))
        return 0
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="moe_bench_")
        args.workdir = tmp.name
    root = Path(args.workdir)
    if not (root / "base" / "config.json").is_file():
        _build(args, root)
    rows = []
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--_variant", variant, "--workdir", str(root)]
        for key in ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab", "experts",
                    "rank", "batch", "tokens", "decode_tokens", "repeats", "threads", "device"):
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
            rows.append({"variant": variant, "error": tail[0][:120]})
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = next((r for r in rows if r["variant"] == "base" and "error" not in r), None)
    print(f"# K={args.experts} r={args.rank} hidden={args.hidden} layers={args.layers} "
          f"batch={args.batch}x{args.tokens} device={args.device} threads={args.threads}")
    print(f"{'variant':8s} {'prefill ms':>11s} {'x base':>7s} {'decode ms/tok':>14s} "
          f"{'x base':>7s} {'peak MiB':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:8s} error: {r['error']}")
            continue
        ratio = r["prefill_ms"] / base["prefill_ms"] if base else float("nan")
        dec = r["decode_ms_per_token"]
        dec_ratio = (dec / base["decode_ms_per_token"]) if (dec and base and
                                                            base["decode_ms_per_token"]) else None
        print(f"{r['variant']:8s} {r['prefill_ms']:11.1f} {ratio:7.2f} "
              f"{dec if dec is not None else float('nan'):14.2f} "
              f"{dec_ratio if dec_ratio is not None else float('nan'):7.2f} {r['peak_mib']:9.0f}")
    print(json.dumps(rows))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
