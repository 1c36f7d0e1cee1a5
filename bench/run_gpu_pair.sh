#!/usr/bin/env bash
# The GPU benchmark on a two-GPU host: qwen3-tts-0.6b on GPU 0 and qwen3-tts-1.7b on GPU 1 at the same time
# (each model still has one whole H200 to itself), then the report over both.
#
#   bench/run_gpu_pair.sh OUT_DIR PHASES [bench/run_gpu.py options]
#   e.g. bench/run_gpu_pair.sh bench/results/serving_h200 latency,poisson,closed --slots 320
#
# Per-model logs go to OUT_DIR/run_<size>.log; run_gpu.py's files land in OUT_DIR as with run_gpu.sh.
set -euo pipefail

OUT_DIR=${1:?usage: bench/run_gpu_pair.sh OUT_DIR PHASES [run_gpu.py options]}
PHASES=${2:?usage: bench/run_gpu_pair.sh OUT_DIR PHASES [run_gpu.py options]}
shift 2
HERE=$(dirname "$0")
mkdir -p "$OUT_DIR"

"$HERE/run_gpu.sh" --install-only
export VX_INSTALLED=1
pids=()
gpu=0
for model in qwen3-tts-0.6b qwen3-tts-1.7b; do
  CUDA_VISIBLE_DEVICES=$gpu "$HERE/run_gpu.sh" "$OUT_DIR" --models "$model" --phases "$PHASES" "$@" \
    >"$OUT_DIR/run_${model#qwen3-tts-}.log" 2>&1 &
  pids+=($!)
  gpu=$((gpu + 1))
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
"$HERE/run_gpu.sh" "$OUT_DIR" --models "" --phases report || status=1
exit $status
