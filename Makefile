# The two commands of README.md: `make demo` (install, run the stack on the built-in tiny model, write audio)
# and `make test` (install, lint, run the CPU test suite). .ci/run calls `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test lint demo protos clean promtool

# promtool (Debian's prometheus package) lints each process's /metrics; best effort, the check is skipped
# where it cannot be installed (no root, no apt).
promtool:
	@command -v promtool >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  ( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus) >/dev/null 2>&1 || echo "note: promtool not installed; its checks will be skipped" )

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check .

test: install lint promtool
	$(BIN)/python -m pytest -m "not gpu" -q

protos: install
	$(BIN)/python scripts/gen_protos.py

demo: install
	$(BIN)/python -m voxstage demo --out out/demo.wav

clean:
	rm -rf $(VENV) build *.egg-info out
