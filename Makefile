# The two commands of README.md: `make demo` (install, run the stack on the built-in tiny model, write audio)
# and `make test` (install, lint, run the CPU test suite). .ci/run calls `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test lint demo protos clean

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

test: install lint
	$(BIN)/python -m pytest -m "not gpu" -q

protos: install
	$(BIN)/python scripts/gen_protos.py

demo: install
	$(BIN)/python -m voxstage demo --out out/demo.wav

clean:
	rm -rf $(VENV) build *.egg-info out
