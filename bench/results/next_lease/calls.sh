#!/usr/bin/env bash
# The device calls queued for the next lease of an H200 (the device tool's `run`, one call each, under its
# 600 s limit), for the open GPU acceptance points of issues 28 and 30. Run from the repository root with
# the carried wheels (bench/results/next_lease/wheels.sh makes build/bench_wheels):
#
#   run(command="export OUT; bash bench/results/next_lease/calls.sh a", carry=["build/bench_wheels"],
#       timeout_s=600)
#
# `a` and `b` ran on 2026-12-05 (twelfth session), `g` and a first `h` the same day (thirteenth session);
# `h` and `k` on an H100 only (fourteenth session, bench/results/h100_2026-12-05_fourteenth/); `m`, `v` and
# `p` on the H200 (fifteenth session, bench/results/h200_2026-12-05_fifteenth/: TTFA at 1 req/s 22.3 ms p50,
# c=1 RTF 0.067; the uploaded in-context clone 1.2-3.3 ms behind the built-in voice, its prepare CPU-bound).
# `v`, `p`, `l` and `d` on the H200 (sixteenth session, bench/results/h200_2026-12-05_sixteenth/);
# `d`, `c`, `n`, `o`, `q` on an H100 (seventeenth session, bench/results/h100_2026-12-05_seventeenth/).
# `z`, `u` and `w` on an H100 (nineteenth session, bench/results/h100_2026-12-06_nineteenth/): two codec lanes
# wedged the codec (both lanes' graphs captured on one stream shared a cuBLAS workspace; each lane now
# captures on its own stream). `u`, `y`, `z`, `t` and the first part of `e` on an H100 (twentieth session,
# bench/results/h100_2026-12-06_twentieth/): the lanes no longer wedge; riding (`pace_ride_s`, now on with
# pacing) took the openai face from 64 to 128 gap-free. `t`, `j`, `t2`, `i`, `f`, `s` and `k` on an H100
# (twenty-first session, bench/results/h100_2026-12-06_twentyfirst/): paced 128 against unpaced 96 on both
# faces (pacing is now Qwen3-TTS's default on a GPU: the unpaced arms pass `pace_realtime_x=0`), and the
# loaded ticks that bound 256 Qwen3 and 128 Audio8 streams (the GPU busy 97 % in both). Left: on an
# nvidia-h200-x2 lease, `x2 q3 one-gpu|split|pair-per-gpu` and `x2 pp one-gpu|split` (issue 31); on an H200,
# `t` and `t2` again (the openai aim and the pacing default on the H200 itself), `p` (is the prepare's linear
# cost per new shape?), `v` (a clone's prompt now makes one text projection, not two), `h` (the GPU tests of
# the fourteenth session's paths on the H200, the engines' phased profile).
# Each call installs (bench/run_gpu.sh --install-only), runs its parts under their own timeouts, writes each
# part's exit status to $OUT/rc.txt and its results, packed, to $OUT/<call>.tar.xz.
# After the lease: unpack into bench/results/h200_<date>_<session>/, pack (python -m bench.pack_results),
# write docs/benchmarks.md (naming this script's commit), and queue the next calls here.
set -u
CALL=${1:?usage: bench/results/next_lease/calls.sh a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p|q|r|s|t|t2|u|v|w|y|z|x2 MODEL LAYOUT}
: "${OUT:?OUT: the folder that comes back}"
R=/tmp/r; rm -rf $R; mkdir -p $R  # a warm machine keeps the last call's: not packed again
bash bench/run_gpu.sh --install-only > $R/install.log 2>&1
export PYTHONPATH=/tmp/vx-pkg:/tmp/vx-site:. VOXSTAGE_CACHE=/tmp/vxcache VX_INSTALLED=1  # installed once
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
  tar cJf "$OUT/$CALL.tar.xz" -C $R --exclude='*.log' --exclude='*.wav' .  # kept if a later part is cut
}

spy() {  # spy ROLE DELAY SECONDS: py-spy (native frames, not stopping the process) on a stage, later
  ( sleep "$2"; pid=$(pgrep -f "voxstage $1" | head -1)
    [[ -n "$pid" ]] && timeout $(($3 + 15)) /tmp/vx-site/bin/py-spy record --nonblocking --native --threads \
      -r 100 -d "$3" -f raw -o "$R/pyspy_$1_$2.txt" --pid "$pid" > "$R/pyspy_$1_$2.log" 2>&1 ) &
}

voice_arms() {  # issue 30: a clone's first audio hop by hop, uploaded and inline, against the built-in voice's
  part voice 250 python3 -m bench.voice_library --out $R/voice --model qwen3-tts-0.6b-base \
    --builtin-model qwen3-tts-0.6b --device cuda --rate 1 --duration 24 --rounds 4 --frames 50 \
    --clip-seconds 10 --warmup-requests 3 --arms uploaded,inline,uploaded_xvector,builtin --stamps
  rm -rf $R/voice/voices_*
}

case "$CALL" in
a)  # issue 30: which part of a clone's first audio holds its time (engines alone, then served, hop by hop
    # with the arms in turns, the built-in arm being TTFA at 1 req/s); issue 28: a join burst's prompts;
    # the GPU tests of the host-sync-free paths (Audio8's prefill is new)
    part gputests 70 python3 -m pytest -q -m gpu tests/gpu/test_no_host_syncs.py
    part voice_ttfa 110 python3 bench/families/qwen3_tts/voice_ttfa.py --out $R/voice_ttfa.json
    part voice 210 python3 -m bench.voice_library --out $R/voice --model qwen3-tts-0.6b-base \
      --builtin-model qwen3-tts-0.6b --device cuda --rate 1 --duration 32 --rounds 4 --frames 50 \
      --clip-seconds 10 --warmup-requests 3 --arms uploaded,uploaded_xvector,builtin --stamps
    rm -rf $R/voice/voices_*
    part burst 110 python3 -m bench.talker_burst --out $R/talker_burst_256.json --device cuda \
      --model qwen3-tts-0.6b --streams 256 --repeats 3
    ;;
b)  # issue 28: the paced closed search from 128, first chunks leading (today's default) against yielding
    # to playing streams (codec_first_chunks), back to back; py-spy on the codec in the first
    spy codec 45 15
    part q3_paced_lead 270 bash bench/run_gpu.sh $R/q3_paced_lead "${Q3[@]}" --phases closed \
      --closed-start 128 "${PACE[@]}"
    part q3_paced_yield 270 bash bench/run_gpu.sh $R/q3_paced_yield "${Q3[@]}" \
      --phases closed --closed-start 128 "${PACE[@]}" --set stages.1.codec_first_chunks=yield
    ;;
g)  # issue 28: the paced closed search from 128 with the codec's tick launch copying from pageable memory
    # (bench/pageable_hook, as before voxstage.host_copy) and through pinned memory (today's), back to back;
    # issue 30: a clone's first audio hop by hop again, now with the talker engine's own points
    part q3_paced_pageable 200 env VX_HOOK="$PWD/bench/pageable_hook" bash bench/run_gpu.sh \
      $R/q3_paced_pageable "${Q3[@]}" --phases closed --closed-start 128 "${PACE[@]}"
    part q3_paced_pinned 200 bash bench/run_gpu.sh $R/q3_paced_pinned "${Q3[@]}" --phases closed \
      --closed-start 128 "${PACE[@]}"
    part voice 180 python3 -m bench.voice_library --out $R/voice --model qwen3-tts-0.6b-base \
      --builtin-model qwen3-tts-0.6b --device cuda --rate 1 --duration 24 --rounds 4 --frames 50 \
      --clip-seconds 10 --warmup-requests 3 --arms uploaded,builtin --stamps
    rm -rf $R/voice/voices_*
    ;;
h)  # issue 30: a first frame from the prefill's hidden state (the clone's prompt prefills anyway; its first
    # step then skips the backbone), and a prefill's attention in the pool kernel (its tokens as rows): the
    # GPU tests of the paths that changed first (a failure there explains a stack that will not start),
    # then the clone's first audio hop by hop against the built-in voice's and the engines' parts with a
    # phased profile (kernels per part: the prefill forward was 516-576)
    part gputests 170 python3 -m pytest -q -m gpu tests/gpu/test_cuda_graphs.py \
      tests/gpu/test_no_host_syncs.py tests/unit/talker/test_qwen3_tts_talker_cuda.py \
      tests/gpu/test_fused_ops.py tests/gpu/test_pool_attention.py
    part voice 200 python3 -m bench.voice_library --out $R/voice --model qwen3-tts-0.6b-base \
      --builtin-model qwen3-tts-0.6b --device cuda --rate 1 --duration 24 --rounds 4 --frames 50 \
      --clip-seconds 10 --warmup-requests 3 --arms uploaded,uploaded_xvector,builtin --stamps
    rm -rf $R/voice/voices_*
    part voice_ttfa 110 python3 bench/families/qwen3_tts/voice_ttfa.py --out $R/voice_ttfa.json
    ;;
k)  # issue 28: kernels and device ms per call after the fourteenth session's cuts, against the profiles of
    # bench/results/h200_2026-12-01/qwen3_levers (same tool): the codec's decode (one lookup for all 16
    # codebooks, one q/k/v and one gate/up GEMM, one rotary pass, residual add + RMSNorm and SiLU-product
    # kernels a layer; 871 kernels, 2.41 ms busy at 1x1 and 924, 107 ms at 64x25 in fp32, the served dtype)
    # and the talker's frame step (draws sharing their rows' derived parameters, slots' seed keys; 1,599
    # kernels with top-k at B=1); first the codec's GPU tests of those paths
    part gputests_codec 120 python3 -m pytest -q -m gpu tests/gpu/test_codec_fused.py \
      tests/unit/codec/test_qwen3_tts_decoder_gpu.py tests/gpu/test_codec_deadline_cuda.py
    mkdir -p $R/prof
    part prof 300 python3 -m bench.families.qwen3_tts.profile_gpu --out $R/prof/profile_0.6b.json \
      --parts talker,codec --levers sampler,dtype --quick
    ;;
m)  # issues 30 and 28 after the fifteenth session's two cuts of every request's way to its first audio (a
    # gRPC StreamingSynthesize text rides in the open: the open waits up to 2 ms for it; the codec's engine
    # opens the stream while the talker opens): a clone's first audio hop by hop against the built-in
    # voice's (the in-context clone's prompt no longer waits for the end of input), then TTFA at 1 req/s and
    # c=1 RTF (the thirteenth session's H200: uploaded - built-in +3.68 ms p50; TTFA 27.0-29.0 ms p50)
    voice_arms
    part q3_latency 240 bash bench/run_gpu.sh $R/q3_latency "${Q3[@]}" --phases latency,report
    ;;
v)  # issue 30 alone, for a short lease: the uploaded clone against the built-in voice with 150 requests an
    # arm in 10 rounds (23 in 4 before: the p50 difference's 95 % bootstrap interval was +-3 ms, the runs
    # +1.2, +3.3 and +2.8), and that interval (diff_p50_interval_ms)
    part voice 480 python3 -m bench.voice_library --out $R/voice --model qwen3-tts-0.6b-base \
      --builtin-model qwen3-tts-0.6b --device cuda --rate 1 --duration 150 --rounds 10 --frames 50 \
      --clip-seconds 10 --warmup-requests 3 --arms uploaded,builtin --stamps
    rm -rf $R/voice/voices_*
    ;;
p)  # the talker's prepare: served, its linear calls (the text projection) took 0.75-0.9 ms of host time
    # each (sixteenth session's profile). First the engine alone on the device in the served dtype, back to
    # back at one text length, at a new length each call, and after idle (a per-shape GEMM cost shows as
    # varied > hot); then served, wall clock against the engine thread's CPU time (the stamp hook with
    # VX_PREPARE_OUT), and the same under cProfile
    part prepare_cold 150 python3 bench/families/qwen3_tts/prepare_cold.py --out $R/prepare_cold.json \
      --device cuda --size 0.6b --requests 30
    mkdir -p $R/prepare
    part prepare 200 env VX_PREPARE_OUT=$R/prepare python3 -m bench.voice_library --out $R/voice_p \
      --model qwen3-tts-0.6b-base --builtin-model qwen3-tts-0.6b --device cuda --rate 1 --duration 12 \
      --rounds 2 --frames 50 --clip-seconds 10 --warmup-requests 3 --arms uploaded,builtin --stamps
    rm -rf $R/voice_p/voices_*
    mkdir -p $R/prepare_prof  # the same under cProfile (slower): where the CPU time goes
    part prepare_prof 200 env VX_PREPARE_OUT=$R/prepare_prof VX_PREPARE_PROFILE=1 python3 -m bench.voice_library \
      --out $R/voice_pp --model qwen3-tts-0.6b-base --builtin-model qwen3-tts-0.6b --device cuda --rate 1 \
      --duration 12 --rounds 2 --frames 50 --clip-seconds 10 --warmup-requests 3 --arms uploaded,builtin --stamps
    rm -rf $R/voice_pp/voices_*
    ;;
l)  # issue 28: the latency aims after the fourteenth session's cuts (TTFA at 1 req/s, c=1 RTF), and the
    # served codec's start-up cost fit (3.87 ms + 66 us a frame-row in the tenth session) in its log
    part q3_latency 240 bash bench/run_gpu.sh $R/q3_latency "${Q3[@]}" --phases latency,report
    ;;
c)  # issue 28: where Qwen3 stands on today's code through both faces, paced from 128 (the tenth
    # session: openai 48, gRPC 128; the thirteenth: gRPC 128), py-spy on both stages during the gRPC one
    part q3_openai 270 bash bench/run_gpu.sh $R/q3_openai "${Q3[@]}" --phases openai \
      --closed-start 128 "${PACE[@]}"
    spy codec 45 15; spy talker 65 15
    part q3_paced 270 bash bench/run_gpu.sh $R/q3_paced "${Q3[@]}" --phases closed \
      --closed-start 128 "${PACE[@]}"
    ;;
d)  # issue 28, Audio8: the seed runs its codec eager with sync scheduling (`enforce_eager: true`), and at
    # 96 streams every late chunk was the codec's with its process at a full core (sixteenth session: 64
    # gap-free with fifo and with deadline ticks alike). The same search with the codec's decode graphed
    # and both stages' scheduling async (as Qwen3's seed has them), then eager again as the control
    part a8_graphed 270 bash bench/run_gpu.sh $R/a8_graphed "${A8[@]}" --phases closed --closed-start 64 \
      --set stages.1.enforce_eager=false --set stages.1.async_scheduling=true \
      --set stages.0.async_scheduling=true
    part a8_eager 270 bash bench/run_gpu.sh $R/a8_eager "${A8[@]}" --phases closed --closed-start 64
    ;;
n)  # issue 28, Audio8 after `d` (seventeenth session, H100: graphed 64, eager 32; at 96 every late chunk the
    # codec's): the graphed codec in bf16 (py-spy on it). Ran in the seventeenth session (with the first
    # graph_pool, since rewritten: one 6,400-row graph reserved ~50 GiB in either capture order)
    G8=(--set stages.1.enforce_eager=false --set stages.1.async_scheduling=true \
      --set stages.0.async_scheduling=true)
    spy codec 70 15
    part a8_bf16 270 bash bench/run_gpu.sh $R/a8_bf16 "${A8[@]}" --phases closed --closed-start 64 "${G8[@]}" \
      --set connectors.connector_of_shared_memory.extra.audio8_tts_codec_dtype=bfloat16
    ;;
o)  # issue 28: the codec's start-up graphs under deadline ticks are the buckets within the budget (on the
    # H100 the fifo set at 256 slots did not fit): its memory and time at 256 slots, then the paced closed
    # search from 128 on a stack of 256 slots (the H100 fell back to 128 before)
    part pool 150 python3 -m bench.graph_pool --out $R/pool_deadline.json --streams 256 --set "$S"
    part q3_paced256 330 bash bench/run_gpu.sh $R/q3_paced256 "${Q3[@]}" --phases closed \
      --closed-start 128 "${PACE[@]}"
    ;;
q)  # issue 28: at 256 paced streams (H100, call o) the codec's calls held 68 frame rows on average (a 20 ms
    # tick holds 8 x 25 in fp32 there: 140 us a frame-row, against 76 at 1,024 rows); the same search from
    # 192 with ticks of 40 ms, larger calls at the cost of a young chunk's wait
    part q3_budget40 240 bash bench/run_gpu.sh $R/q3_budget40 "${Q3[@]}" --phases closed \
      --closed-start 192 "${PACE[@]}" --set stages.1.codec_tick_budget_ms=40
    ;;
r)  # issue 28: at 256 paced streams half the GPU was the codec's fp32 calls (call o, H100); the same search
    # with the codec in bf16 (qwen3_tts_codec_dtype: +27 % codec throughput alone, 5.3 % relative RMS)
    part q3_bf16 300 bash bench/run_gpu.sh $R/q3_bf16 "${Q3[@]}" --phases closed --closed-start 128 "${PACE[@]}" \
      --set connectors.connector_of_shared_memory.extra.qwen3_tts_codec_dtype=bfloat16
    ;;
s)  # issue 28, Audio8 graphed (64 gap-free, call d): its fifo ticks took ~1,000 rows (0.5 s) at 96 streams and
    # held young streams' chunks; bounded ticks lost when its codec was eager (16 against 24, 2026-12-03).
    # Graphed and async, deadline ticks of 40 ms, then of 80 ms
    G8=(--set stages.1.enforce_eager=false --set stages.1.async_scheduling=true \
      --set stages.0.async_scheduling=true --set stages.1.codec_tick_policy=deadline)
    part a8_deadline40 270 bash bench/run_gpu.sh $R/a8_deadline40 "${A8[@]}" --phases closed --closed-start 64 \
      "${G8[@]}" --set stages.1.codec_tick_budget_ms=40
    part a8_deadline80 270 bash bench/run_gpu.sh $R/a8_deadline80 "${A8[@]}" --phases closed --closed-start 64 \
      "${G8[@]}" --set stages.1.codec_tick_budget_ms=80
    ;;
e)  # issue 28: the paced closed search again with held streams riding along (pace_ride_s 3), first
    # chunks leading and yielding; compare with call b's
    part q3_ride_lead 270 bash bench/run_gpu.sh $R/q3_ride_lead "${Q3[@]}" --phases closed \
      --closed-start 128 "${PACE[@]}" --set stages.0.pace_ride_s=3
    part q3_ride_yield 270 bash bench/run_gpu.sh $R/q3_ride_yield "${Q3[@]}" --phases closed \
      --closed-start 128 "${PACE[@]}" --set stages.0.pace_ride_s=3 --set stages.1.codec_first_chunks=yield
    ;;
f)  # issue 28 acceptance 3: the timeline of one loaded tick per stage, after (256 paced streams; yield lost
    # to lead in the twelfth session, so today's defaults); first the GPU test of the codec's start-up graph
    # set under deadline ticks (calibrate, then capture what a tick can call; no tick meets another bucket)
    part gputests_deadline 90 python3 -m pytest -q -m gpu tests/gpu/test_codec_deadline_cuda.py
    part q3_timeline 300 bash bench/run_gpu.sh $R/q3_timeline "${Q3[@]}" --phases timeline \
      --timeline-load 256 --timeline-window-s 2 "${PACE[@]}"
    ;;
u)  # issue 28: two codec lanes (codec_urgent_lane_ms, services/codec/lanes.py; eighteenth session, no
    # device then): first and ramp chunks on a high-priority CUDA stream in ticks of 10 ms, steady chunks in
    # ticks of 60 ms on a low-priority one (one lane: 20 ms ticks made 68-row calls, 140 us a frame row on
    # the H100; 40 ms ticks lost the ramp, call q). The lanes' GPU test first, the codec alone (one lane's 20
    # ms ticks against lanes of 10 / 60 ms), then the paced search from 128
    part gputests_lanes 90 python3 -m pytest -q -m gpu tests/gpu/test_codec_lanes_cuda.py
    part cs_lanes 110 python3 -m bench.codec_schedule --out $R/cs_lanes.json --duration 8 \
      --arms deadline:20,lanes:10:60
    part q3_lanes 330 bash bench/run_gpu.sh $R/q3_lanes "${Q3[@]}" --phases closed --closed-start 128 \
      "${PACE[@]}" --set stages.1.codec_urgent_lane_ms=10 --set stages.1.codec_tick_budget_ms=60
    ;;
w)  # issue 28, Audio8 graphed (64 gap-free, call d; its codec engine thread 81-88 % of a core): its fifo
    # ticks take whole chunks up to 100 frames from streams behind (the talker runs ~3x real time), and
    # frames past the largest graph bucket (25: its chunk sizes) decode eagerly. With graphs for 50, 75 and
    # 100 frames (decode_cudagraph_capture_sizes), then the same with two lanes (first and ramp chunks on a
    # high-priority CUDA stream: ~1,000-row fifo ticks of 0.5 s held young streams' chunks)
    G8=(--set stages.1.enforce_eager=false --set stages.1.async_scheduling=true \
      --set stages.0.async_scheduling=true \
      --set 'connectors.connector_of_shared_memory.extra.decode_cudagraph_capture_sizes=[50,75,100]')
    part a8_catchup 260 bash bench/run_gpu.sh $R/a8_catchup "${A8[@]}" --phases closed --closed-start 64 \
      "${G8[@]}"
    part a8_lanes 260 bash bench/run_gpu.sh $R/a8_lanes "${A8[@]}" --phases closed --closed-start 64 \
      "${G8[@]}" --set stages.1.codec_urgent_lane_ms=10
    ;;
i)  # issue 28, Audio8 graphed (64 gap-free, call d): unpaced, its talker runs ~3x real time, so the codec
    # decodes three audio seconds a second for every stream (fifo ticks of ~1,000 rows at 96). Pacing lost on
    # its eager codec (32 -> 24, tenth session), before riding: graphed and async, paced with riding, from 64
    G8=(--set stages.1.enforce_eager=false --set stages.1.async_scheduling=true \
      --set stages.0.async_scheduling=true)
    part a8_paced 300 bash bench/run_gpu.sh $R/a8_paced "${A8[@]}" --phases closed --closed-start 64 \
      "${G8[@]}" "${PACE[@]}"
    ;;
j)  # issue 28 acceptance 4 for Audio8 (64 gap-free; at 96 every late chunk the codec's, with one lane or
    # two): the timeline of one loaded tick per stage at 96 streams, graphed and async, and py-spy on the
    # codec meanwhile (its process at a full core, its fifo ticks ~1,000 rows)
    G8=(--set stages.1.enforce_eager=false --set stages.1.async_scheduling=true \
      --set stages.0.async_scheduling=true)
    spy codec 90 15
    # 128 slots: a graphed Audio8 codec's fifo graphs for 256 outgrew the H100 (call y); the timeline phase
    # does not fall back
    part a8_timeline 300 bash bench/run_gpu.sh $R/a8_timeline "${A8[@]}" --slots 128 --phases timeline \
      --timeline-load 96 --timeline-window-s 2 "${G8[@]}"
    ;;
t)  # issue 28, after `z` (twentieth session, H100: the three levers together held 128 through the openai
    # client with no stall): which of them count, through the client from 128 on one machine. Holding
    # without riding (the defaults before the twentieth session), then the lanes and riding without the
    # bf16 codec, then riding alone (today's defaults with pacing)
    part q3_openai_base 200 bash bench/run_gpu.sh $R/q3_openai_base "${Q3[@]}" --phases openai \
      --closed-start 128 "${PACE[@]}" --set stages.0.pace_ride_s=0
    part q3_openai_lanes_ride 200 bash bench/run_gpu.sh $R/q3_openai_lanes_ride "${Q3[@]}" --phases openai \
      --closed-start 128 "${PACE[@]}" --set stages.1.codec_urgent_lane_ms=10 \
      --set stages.1.codec_tick_budget_ms=60 --set stages.0.pace_ride_s=3
    part q3_openai_ride 200 bash bench/run_gpu.sh $R/q3_openai_ride "${Q3[@]}" --phases openai \
      --closed-start 128 "${PACE[@]}" --set stages.0.pace_ride_s=3
    ;;
t2) # issue 28: unpaced through both faces, beside `t`'s paced arms on the same machine (twenty-first
    # session, H100: 96 unpaced against 128 paced on both faces, so Qwen3-TTS now paces by default on a GPU;
    # `pace_realtime_x=0` is unpaced)
    OFF=(--set stages.0.pace_realtime_x=0)
    part q3_openai_unpaced 250 bash bench/run_gpu.sh $R/q3_openai_unpaced "${Q3[@]}" --phases openai \
      --closed-start 96 "${OFF[@]}"
    part q3_unpaced 250 bash bench/run_gpu.sh $R/q3_unpaced "${Q3[@]}" --phases closed --closed-start 96 \
      "${OFF[@]}"
    ;;
y)  # issue 28, Audio8 graphed and async (64 gap-free, call d): its fifo ticks of ~1,000 rows (0.5 s) held
    # young streams' chunks. Two lanes (first and ramp chunks on a high-priority stream in 10 ms ticks, each
    # lane's graphs captured on its own stream since the nineteenth session's wedge), the seed's capture
    # sizes; py-spy on the codec
    G8=(--set stages.1.enforce_eager=false --set stages.1.async_scheduling=true \
      --set stages.0.async_scheduling=true)
    spy codec 70 15
    part a8_lanes 300 bash bench/run_gpu.sh $R/a8_lanes "${A8[@]}" --phases closed --closed-start 64 \
      "${G8[@]}" --set stages.1.codec_urgent_lane_ms=10
    ;;
z)  # issue 28, Qwen3 at 256 with the three unmeasured levers together (then `u`, `e` and `r` say which
    # counts): two codec lanes (10 / 60 ms), held streams riding along (pace_ride_s 3: at 256 paced streams
    # the talker ran ~37 steps a second over its whole batch bucket, most rows masked, 42 % of the GPU), and
    # the codec in bf16; gRPC from 192, then the openai face from 128
    LEVERS=(--set stages.1.codec_urgent_lane_ms=10 --set stages.1.codec_tick_budget_ms=60 \
      --set stages.0.pace_ride_s=3 \
      --set connectors.connector_of_shared_memory.extra.qwen3_tts_codec_dtype=bfloat16)
    part q3_levers 280 bash bench/run_gpu.sh $R/q3_levers "${Q3[@]}" --phases closed --closed-start 192 \
      "${PACE[@]}" "${LEVERS[@]}"
    part q3_levers_openai 270 bash bench/run_gpu.sh $R/q3_levers_openai "${Q3[@]}" --phases openai \
      --closed-start 128 "${PACE[@]}" "${LEVERS[@]}"
    ;;
x2) # issue 31 on nvidia-h200-x2 (docs/scaling.md): `calls.sh x2 q3|pp LAYOUT`, one call each, every call
    # appending to $R/layouts, whose report renders what is there
    MODEL=${2:?x2: q3 or pp}; LAYOUT=${3:?x2: one-gpu, split or pair-per-gpu}
    if [[ $MODEL == q3 ]]; then
      part "x2_q3_$LAYOUT" 560 bash bench/run_gpu.sh $R/layouts --models qwen3-tts-0.6b \
        --layout "$LAYOUT" --phases latency,closed,report --profile quick --slots 320 --max-model-len 512 \
        --set "$S"
    else
      part "x2_pp_$LAYOUT" 560 bash bench/run_gpu.sh $R/layouts --models personaplex-7b \
        --layout "$LAYOUT" --phases realtime,report --realtime-levels 32,64 --realtime-seconds 60 \
        --client-procs 4 --set stages.0.gpu_memory_utilization=0.86 \
        --set stages.1.gpu_memory_utilization=0.1 --set stages.1.enforce_eager=false
    fi
    rm -f "$OUT/$CALL.tar.xz"; CALL="x2_${MODEL}_$LAYOUT"
    ;;
*)  echo "unknown call $CALL" >&2; exit 2 ;;
esac
wait
cp $R/install.log "$OUT/" 2>/dev/null
tar cJf "$OUT/$CALL.tar.xz" -C $R --exclude='*.log' --exclude='*.wav' .
