#!/usr/bin/env bash
# The moe_forward benchmark at a realistic size on a GPU (one H100/H200-class card).
#
#   bash bench/gpu_moe.sh                 # writes bench/results/gpu_moe_<date>.txt
#   EXPERTS=8 TOKENS=4096 bash bench/gpu_moe.sh
#
# Shape defaults to the reference backbone of the TRACE paper's gate count (48 layers,
# hidden 2048: 491,760 gate parameters at K=4) with a Qwen-like MLP; weights are random
# (no download: the GPU box may be offline) and bf16. Variants, side by side in one process,
# timed round-robin: the base alone, the top-1 gated model (sparse dispatch), the dense
# all-adapter reference, and peft's X-LoRA over the same adapters. Goal: top-1 within 1.3x
# of the base at K=4. Peak memory per variant is measured in a fresh process (--memory).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
test -x "$PY" || PY=python3
EXPERTS=${EXPERTS:-4}
RANK=${RANK:-16}
TOKENS=${TOKENS:-2048}
BATCH=${BATCH:-4}
LAYERS=${LAYERS:-48}
HIDDEN=${HIDDEN:-2048}
INTERMEDIATE=${INTERMEDIATE:-5504}
HEADS=${HEADS:-16}
KV_HEADS=${KV_HEADS:-4}
VOCAB=${VOCAB:-32000}
REPEATS=${REPEATS:-10}
WORKDIR=${WORKDIR:-$(mktemp -d /tmp/gpu_moe.XXXXXX)}
mkdir -p bench/results
OUT=bench/results/gpu_moe_$(date -u +%Y%m%d-%H%M%S).txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT"
HF_HUB_OFFLINE=1 "$PY" bench/moe_forward.py --device cuda --workdir "$WORKDIR" \
  --experts "$EXPERTS" --rank "$RANK" --tokens "$TOKENS" --batch "$BATCH" \
  --layers "$LAYERS" --hidden "$HIDDEN" --intermediate "$INTERMEDIATE" --heads "$HEADS" \
  --kv-heads "$KV_HEADS" --vocab "$VOCAB" --repeats "$REPEATS" --decode-tokens 64 \
  --threads 8 --memory --variant-timeout 900 2>&1 | grep -v "Loading weights" | tee -a "$OUT"
echo "results: $OUT"
