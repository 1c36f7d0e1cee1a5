# Eleventh session call 1: GPU tests (SlotWrites on CUDA), the voice library in rounds (issue 30), Qwen3 latency.
set -u
R=/tmp/r; mkdir -p $R
bash bench/run_gpu.sh --install-only > $R/install.log 2>&1
export PYTHONPATH=/tmp/vx-pkg:/tmp/vx-site:. VOXSTAGE_CACHE=/tmp/vxcache
timeout 120 python3 -m pytest -q -m gpu -x --durations=8 tests/gpu/test_no_host_syncs.py tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_audio8_tts_cuda.py > $OUT/gputests.log 2>&1; echo "gpu tests rc=$?" > $OUT/rc.txt
timeout 270 python3 -m bench.voice_library --out $R/voice \
  --model qwen3-tts-0.6b-base --builtin-model qwen3-tts-0.6b --device cuda --rate 1 --duration 40 --rounds 4 --frames 50 \
  --clip-seconds 10 --warmup-requests 3 --arms uploaded,uploaded_xvector,builtin > $R/voice.log 2>&1; echo "voice rc=$?" >> $OUT/rc.txt
rm -rf $R/voice/voices_*
S='connectors.connector_of_shared_memory.extra.decode_cudagraph_capture_sizes=[2,4,8,16,32,64,100]'
VX_INSTALLED=1 timeout 130 bash bench/run_gpu.sh $R/q3_latency --models qwen3-tts-0.6b --phases latency,report --profile quick \
  --slots 256 --max-model-len 512 --set "$S" > $R/q3l.log 2>&1; echo "q3 latency rc=$?" >> $OUT/rc.txt
tail -c 30000 $R/q3l.log > $OUT/q3l.tail.log; cp $R/voice.log $R/install.log $OUT/ 2>/dev/null
tar cJf $OUT/runG.tar.xz -C $R --exclude='*.log' .
