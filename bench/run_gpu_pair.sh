#!/usr/bin/env bash
# The GPU benchmark on a host with one GPU per model: the presets the families' descriptors benchmark by
# default (Bench.default_models; today the two TTS sizes), each on its own GPU at the same time (each model
# still has one whole H200 to itself), then the report over all of them.
#
#   bench/run_gpu_pair.sh OUT_DIR PHASES [bench/run_gpu.py options]
#   e.g. bench/run_gpu_pair.sh bench/results/serving_h200 latency,poisson,closed --slots 320
#
# Per-model logs go to OUT_DIR/run_<tag>.log (the tag of its result files); run_gpu.py's files land in
# OUT_DIR as with run_gpu.sh.
set -euo pipefail

OUT_DIR=${1:?usage: bench/run_gpu_pair.sh OUT_DIR PHASES [run_gpu.py options]}
PHASES=${2:?usage: bench/run_gpu_pair.sh OUT_DIR PHASES [run_gpu.py options]}
shift 2
HERE=$(dirname "$0")
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"

# "preset tag" per line, from the registry (voxstage.families needs nothing but the standard library).
mapfile -t MODELS < <(PYTHONPATH="$HERE/../src" "$PY" -c '
from voxstage import families
for f in families.families():
    for m in f.bench.default_models if f.bench else ():
        print(m, m.removeprefix(f.bench.tag_prefix))')

"$HERE/run_gpu.sh" --install-only
export VX_INSTALLED=1
pids=()
gpu=0
for line in "${MODELS[@]}"; do
  read -r model tag <<<"$line"
  CUDA_VISIBLE_DEVICES=$gpu "$HERE/run_gpu.sh" "$OUT_DIR" --models "$model" --phases "$PHASES" "$@" \
    >"$OUT_DIR/run_${tag}.log" 2>&1 &
  pids+=($!)
  gpu=$((gpu + 1))
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
"$HERE/run_gpu.sh" "$OUT_DIR" --models "" --phases report || status=1
exit $status
