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
- Latency: every variant lives in one process (its own copy of the base) and they are
  timed round-robin, repeat after repeat, so a busy shared machine slows all of them
  alike; the figure is the median of `--repeats`. Memory: the weights each variant adds
  over the base, and with `--memory` each variant's peak RSS (CPU) / peak allocated (CUDA)
  in a fresh process of its own.
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
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(root / "base"))
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for k in range(args.experts):
        torch.manual_seed(100 + k)
        # One base instance for every adapter: wrap, write, unwrap (no copy per adapter).
        peft_model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.rank,
                                                      target_modules=targets,
                                                      task_type="CAUSAL_LM"))
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
        peft_model.save_pretrained(str(root / f"adapter{k}"))
        model = peft_model.unload()


def _runner(variant: str, args: argparse.Namespace, root: Path):
    """(module to call, extra MiB of weights it adds over the base) for one variant."""
    import torch
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(root / "base"), dtype=dtype).to(device).eval()
    base_bytes = sum(t.numel() * t.element_size() for t in model.parameters()) + \
        sum(t.numel() * t.element_size() for t in model.buffers())
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
    total = sum(t.numel() * t.element_size() for t in runner.parameters()) + \
        sum(t.numel() * t.element_size() for t in runner.buffers())
    return runner, (total - base_bytes) / 2**20


def _peak_memory(variant: str, args: argparse.Namespace, root: Path) -> dict:
    """Run in a fresh process: load the variant, one forward, report peak memory."""
    import torch

    torch.set_num_threads(args.threads)
    runner, extra = _runner(variant, args, root)
    ids = torch.randint(10, args.vocab - 1, (args.batch, args.tokens),
                        generator=torch.Generator().manual_seed(1)).to(args.device)
    with torch.no_grad():
        runner(input_ids=ids, use_cache=False)
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    return {"variant": variant, "peak_mib": peak, "extra_weights_mib": extra}


def _latency(variants: list[str], args: argparse.Namespace, root: Path) -> dict[str, dict]:
    """All variants in one process, timed round-robin, so machine load hits them alike."""
    import torch

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    runners, extra, failed = {}, {}, {}
    for v in variants:
        try:
            runners[v], extra[v] = _runner(v, args, root)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load is reported
            failed[v] = f"{type(exc).__name__}: {exc}"[:160]
    ids = torch.randint(10, args.vocab - 1, (args.batch, args.tokens),
                        generator=torch.Generator().manual_seed(1)).to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {v: [] for v in runners}
    decode: dict[str, list[float]] = {v: [] for v in runners if v != "xlora"}
    one = ids[:1, :32]
    kw = dict(max_new_tokens=args.decode_tokens, min_new_tokens=args.decode_tokens,
              do_sample=False, pad_token_id=0)
    with torch.no_grad():
        for r in runners.values():  # warm-up
            r(input_ids=ids, use_cache=False)
        for _ in range(args.repeats):
            for v, r in runners.items():
                sync()
                t0 = time.perf_counter()
                r(input_ids=ids, use_cache=False)
                sync()
                times[v].append(time.perf_counter() - t0)
            if args.decode_tokens > 0:
                for v in decode:
                    sync()
                    t0 = time.perf_counter()
                    runners[v].generate(input_ids=one, attention_mask=torch.ones_like(one), **kw)
                    sync()
                    decode[v].append((time.perf_counter() - t0) / args.decode_tokens)
    out = {v: {"variant": v, "error": e} for v, e in failed.items()}
    for v in runners:
        out[v] = {"variant": v, "prefill_ms": statistics.median(times[v]) * 1000,
                  "decode_ms_per_token": (statistics.median(decode[v]) * 1000
                                          if decode.get(v) else None),
                  "extra_weights_mib": extra[v]}
    return out


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
    p.add_argument("--memory", action="store_true",
                   help="also measure each variant's peak memory in its own process")
    p.add_argument("--variant-timeout", type=float, default=900.0,
                   help="seconds before a variant is reported as timed out")
    p.add_argument("--workdir", default=None, help="reuse a folder with the built models")
    p.add_argument("--_variant", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args._variant:
        print(json.dumps(_peak_memory(args._variant, args, Path(args.workdir))))
        return 0
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="moe_bench_")
        args.workdir = tmp.name
    root = Path(args.workdir)
    if not (root / "base" / "config.json").is_file():
        _build(args, root)
    variants = args.variants.split(",")
    by_variant = _latency(variants, args, root)
    if args.memory:
        for variant in variants:
            cmd = [sys.executable, __file__, "--_variant", variant, "--workdir", str(root)]
            for key in ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab",
                        "experts", "rank", "batch", "tokens", "threads", "device"):
                cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.variant_timeout)
                if proc.returncode == 0:
                    mem = json.loads(proc.stdout.strip().splitlines()[-1])
                    by_variant[variant]["peak_mib"] = mem["peak_mib"]
            except subprocess.TimeoutExpired:
                pass
    rows = [by_variant[v] for v in variants]
    base = next((r for r in rows if r["variant"] == "base" and "error" not in r), None)
    print(f"# K={args.experts} r={args.rank} hidden={args.hidden} layers={args.layers} "
          f"batch={args.batch}x{args.tokens} device={args.device} threads={args.threads}")
    print(f"{'variant':8s} {'prefill ms':>11s} {'x base':>7s} {'decode ms/tok':>14s} "
          f"{'x base':>7s} {'+weights MiB':>13s} {'peak MiB':>9s}")
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
              f"{dec_ratio if dec_ratio is not None else float('nan'):7.2f} "
              f"{r['extra_weights_mib']:13.1f} {r.get('peak_mib', float('nan')):9.0f}")
    print(json.dumps(rows))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
