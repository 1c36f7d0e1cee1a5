#!/usr/bin/env bash
# The one command for the GPU benchmark on an offline H200 box, run from the repository root:
#
#   bench/run_gpu.sh OUT_DIR [bench/run_gpu.py options, e.g. --profile full --models PRESET,PRESET]
#   bench/run_gpu.sh --install-only; VX_INSTALLED=1 CUDA_VISIBLE_DEVICES=1 bench/run_gpu.sh OUT_DIR ...
#
# The box has Python 3.12 and a CUDA torch but no internet, so everything else arrives as carried wheels
# (bench/README.md: what to download and carry):
#   build/bench_wheels     voxstage's runtime packages the box may lack (gateway included), and the official
#                          openai client that the `openai` phase measures the HTTP face with -> $VX_SITE
#   build/ref_wheels       qwen-tts 0.1.1 + transformers 4.57.3 and their pure deps -> $REF_ENV, which is
#                          on PYTHONPATH only for the reference process (never next to voxstage)
# voxstage itself is installed from this checkout into $VX_PKG (not editable: the stage processes import it).
set -euo pipefail

OUT_DIR=${1:?usage: bench/run_gpu.sh OUT_DIR|--install-only [run_gpu.py options]}
shift
PY=${PYTHON:-python3}
VX_WHEELS=${VX_WHEELS:-build/bench_wheels}
REF_WHEELS=${REF_WHEELS:-build/ref_wheels}
VX_SITE=${VX_SITE:-/tmp/vx-site}
VX_PKG=${VX_PKG:-/tmp/vx-pkg}
REF_ENV=${REF_ENV:-/tmp/refenv}
PIP=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade)

export PYTHONUNBUFFERED=1
export VOXSTAGE_CACHE=${VOXSTAGE_CACHE:-/tmp/vxcache}
# Single-host NCCL/NVLink multicast stays off (the device notes ask for it; voxstage uses one GPU anyway).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# Several runs on one host (one per GPU, CUDA_VISIBLE_DEVICES set by the caller) share one install:
# `bench/run_gpu.sh --install-only` once, then each run with VX_INSTALLED=1.
if [[ "${VX_INSTALLED:-0}" != 1 ]]; then
  if compgen -G "$VX_WHEELS/*.whl" >/dev/null; then
    "${PIP[@]}" --target "$VX_SITE" "$VX_WHEELS"/*.whl
  fi
  if ! "${PIP[@]}" --no-build-isolation --target "$VX_PKG" . >/dev/null 2>&1; then
    # An image without setuptools cannot build the checkout: lay the packages out by hand (setup.py: each
    # import name is its folder, the floor voxstage comes from src/).
    echo "pip could not install the checkout; linking its folders into $VX_PKG" >&2
    rm -rf "$VX_PKG" && mkdir -p "$VX_PKG" && cp -r src/voxstage "$VX_PKG/voxstage"
    ln -s "$PWD/services" "$VX_PKG/services"
    ln -s "$PWD/gateway" "$VX_PKG/gateway"
  fi
  if compgen -G "$REF_WHEELS/*.whl" >/dev/null; then
    "${PIP[@]}" --target "$REF_ENV" "$REF_WHEELS"/*.whl
  fi
fi
# VX_HOOK: a folder put first on the path (a diagnostic sitecustomize, e.g. bench/pageable_hook)
export PYTHONPATH="${VX_HOOK:+$VX_HOOK:}$VX_PKG:$VX_SITE"
[[ "$OUT_DIR" == --install-only ]] && exit 0

ref_args=()
if [[ -d "$REF_ENV/qwen_tts" ]]; then
  ref_args=(--ref-env "$REF_ENV")
else
  echo "no qwen_tts in $REF_ENV: the reference phase will only work if qwen_tts is importable" >&2
fi

"$PY" -c "import torch, grpc, voxstage; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
# --pack: the run's logs and Prometheus snapshots end in one raw.tar.xz, so it can be committed as it is.
exec "$PY" -m bench.run_gpu --out "$OUT_DIR" --pack "${ref_args[@]}" "$@"
