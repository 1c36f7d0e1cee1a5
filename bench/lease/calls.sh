#!/usr/bin/env bash
# The device calls queued for the next lease of an H200 (the device tool's `run`, one call each, under its
# 600 s limit), for the open GPU acceptance points of issues 28 and 30. Run from the repository root with the
# carried wheels (bench/lease/wheels.sh makes build/bench_wheels):
#
#   run(command="export OUT; bash bench/lease/calls.sh a", carry=["build/bench_wheels"], timeout_s=600)
#
# then `b`, then `c`. Each call installs (bench/run_gpu.sh --install-only), runs its parts under their own
# timeouts, writes each part's exit status to $OUT/rc.txt and its results, packed, to $OUT/<call>.tar.xz.
# After the lease: unpack into bench/results/h200_<date>_<session>/, pack (python -m bench.pack_results),
# copy this script into that folder's scripts/, write docs/benchmarks.md, and queue the next calls here.
set -u
CALL=${1:?usage: bench/lease/calls.sh a|b|c}
: "${OUT:?OUT: the folder that comes back}"
R=/tmp/r; mkdir -p $R
bash bench/run_gpu.sh --install-only > $R/install.log 2>&1
export PYTHONPATH=/tmp/vx-pkg:/tmp/vx-site:. VOXSTAGE_CACHE=/tmp/vxcache
# Capture sizes of the served codec decode (the tenth and eleventh sessions' runs): chunk sizes are added.
S='connectors.connector_of_shared_memory.extra.decode_cudagraph_capture_sizes=[2,4,8,16,32,64,100]'
PACE=(--set stages.0.pace_realtime_x=3 --set stages.0.pace_ahead_s=3)
Q3=(--models qwen3-tts-0.6b --profile quick --slots 256 --max-model-len 512 --set "$S")
A8=(--models audio8-tts-0.6b --profile quick --slots 256)

part() {  # part NAME TIMEOUT CMD...: one measurement, its status and its log
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$R/$name.log" 2>&1
  echo "$name rc=$?" >> "$OUT/rc.txt"
  tail -c 20000 "$R/$name.log" > "$OUT/$name.tail.log"
}

spy() {  # spy ROLE DELAY SECONDS: py-spy (native frames, not stopping the process) on a stage, later
  ( sleep "$2"; pid=$(pgrep -f "voxstage $1" | head -1)
    [[ -n "$pid" ]] && timeout $(($3 + 15)) /tmp/vx-site/bin/py-spy record --nonblocking --native --threads \
      -r 100 -d "$3" -f raw -o "$R/pyspy_$1_$2.txt" --pid "$pid" > "$R/pyspy_$1_$2.log" 2>&1 ) &
}

case "$CALL" in
a)  # issue 30: which part of a clone's first audio holds its time, then the arms in turns; issue 28: paced
    part voice_ttfa 150 python3 bench/families/qwen3_tts/voice_ttfa.py --out $R/voice_ttfa.json
    part voice 200 python3 -m bench.voice_library --out $R/voice --model qwen3-tts-0.6b-base \
      --builtin-model qwen3-tts-0.6b --device cuda --rate 1 --duration 40 --rounds 4 --frames 50 \
      --clip-seconds 10 --warmup-requests 3 --arms uploaded,uploaded_xvector,builtin
    rm -rf $R/voice/voices_*
    spy codec 45 15; spy talker 65 15
    VX_INSTALLED=1 part q3_paced 200 bash bench/run_gpu.sh $R/q3_paced "${Q3[@]}" --phases closed \
      --closed-start 128 "${PACE[@]}"
    ;;
b)  # issue 28: unpaced (the talker as fast as it goes) from 64, and the openai face paced from 128
    spy codec 45 15
    VX_INSTALLED=1 part q3_unpaced 260 bash bench/run_gpu.sh $R/q3_unpaced "${Q3[@]}" --phases closed \
      --closed-start 64
    VX_INSTALLED=1 part q3_openai 260 bash bench/run_gpu.sh $R/q3_openai "${Q3[@]}" --phases openai \
      --closed-start 128 "${PACE[@]}"
    ;;
c)  # issue 28, Audio8: fifo from 32 (the family's default), then a deadline budget of 80 ms
    VX_INSTALLED=1 part a8_fifo 260 bash bench/run_gpu.sh $R/a8_fifo "${A8[@]}" --phases closed \
      --closed-start 32
    VX_INSTALLED=1 part a8_deadline80 260 bash bench/run_gpu.sh $R/a8_deadline80 "${A8[@]}" --phases closed \
      --closed-start 32 --set stages.1.codec_tick_policy=deadline --set stages.1.codec_tick_budget_ms=80
    ;;
*)  echo "unknown call $CALL" >&2; exit 2 ;;
esac
wait
cp $R/install.log "$OUT/" 2>/dev/null
tar cJf "$OUT/$CALL.tar.xz" -C $R --exclude='*.log' .
