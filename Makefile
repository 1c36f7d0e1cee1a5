# The two commands of README.md: `make demo` (install, run the stack on the built-in tiny model, write audio)
# and `make test` (install, lint, run the CPU test suite). .ci/run calls `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test lint demo protos clean promtool ffmpeg buf checkov

# buf (from the npm registry) lints the protos (STANDARD rules); best effort, the test is skipped without it.
BUF := $(CURDIR)/.tools/node_modules/.bin/buf
buf:
	@test -x $(BUF) || ! command -v npm >/dev/null 2>&1 || \
	  npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf@1.75.0 >/dev/null 2>&1 || \
	  echo "note: buf not installed; the proto lint test will be skipped"

# promtool (Debian's prometheus package) lints each process's /metrics; best effort, the check is skipped
# where it cannot be installed (no root, no apt).
promtool:
	@command -v promtool >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  ( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus) >/dev/null 2>&1 || echo "note: promtool not installed; its checks will be skipped" )

# ffmpeg (Debian's package) reads the README's curl example's WAV file as a third reader beside Python's
# wave and soundfile (tests/integration/test_readme_examples.py); best effort like promtool. Skipped without
# it locally; under CI (CI set) the test fails instead.
ffmpeg:
	@command -v ffmpeg >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  ( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    ffmpeg) >/dev/null 2>&1 || echo "note: ffmpeg not installed; the WAV check with ffmpeg will be skipped" )

# checkov (PyPI) checks the Kubernetes manifests (tests/unit/test_k8s_manifests.py). It gets a virtualenv of
# its own because it pins networkx and packaging below what the project's venv holds; pinned, so that a new
# checkov release cannot add findings to CI unannounced. Required: the test fails under CI without it.
CHECKOV_SPEC ?= checkov==3.3.30
CHECKOV := $(CURDIR)/.tools/checkov/bin/checkov
checkov: $(CHECKOV)
$(CHECKOV):
	$(PY) -m venv .tools/checkov
	.tools/checkov/bin/pip install -q "$(CHECKOV_SPEC)"

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

test: install lint promtool ffmpeg buf checkov
	VOXSTAGE_BUF=$$(test -x $(BUF) && echo $(BUF)) VOXSTAGE_CHECKOV=$(CHECKOV) $(BIN)/python -m pytest -m "not gpu" -q --durations=20

protos: install
	$(BIN)/python scripts/gen_protos.py

demo: install
	$(BIN)/python -m voxstage demo --out out/demo.wav

clean:
	rm -rf $(VENV) build *.egg-info out .tools
