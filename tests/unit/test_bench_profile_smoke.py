"""CPU smoke test of ``bench/families/qwen3_tts/profile_gpu.py`` on the tiny preset: it runs as the lead runs
it (a subprocess) and writes one sane record per lever setting. CPU timing is not a benchmark: only shapes
and counts are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.kernel_stats import family, kernel_class

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def test_profile_script_writes_a_record_per_setting(tmp_path: Path) -> None:
    out = tmp_path / "prof.json"
    cmd = [
        sys.executable,
        "bench/families/qwen3_tts/profile_gpu.py",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--quick",
    ]
    env = {**os.environ, "VOXSTAGE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    assert [r for r in records if "error" in r] == []
    talker = [r for r in records if r["part"] == "talker"]
    codec = [r for r in records if r["part"] == "codec"]
    # CPU torch has no Triton: the fused lever has one setting (the PyTorch path), so 2 batches x 3 samplers.
    assert {(r["batch"], r["levers"]["sampler"]) for r in talker} == {
        (b, s) for b in (1, 2) for s in ("top_k", "full", "greedy")
    }
    assert {(r["batch"], r["frames"], r["levers"]["dtype"]) for r in codec} == {
        (b, t, d) for b, t in ((1, 1), (2, 5)) for d in ("bf16", "fp32")
    }
    for r in records:
        assert r["size"] == "tiny" and r["activity"] == "cpu" and r["levers"]["fused"] is False
        assert r["kernels_per_call"] > 100 and r["gpu_busy_ms"] > 0 and r["wall_ms_p50"] > 0
        assert r["top_families"] and all(f["count"] > 0 for f in r["top_families"])
        assert sum(c["count"] for c in r["classes"].values()) == pytest.approx(r["kernels_per_call"], abs=1)
    # Greedy skips the noise and the top-k selection: fewer ops than the sampling variants at each batch.
    ops = {(r["batch"], r["levers"]["sampler"]): r["kernels_per_call"] for r in talker}
    assert all(ops[(b, "greedy")] < ops[(b, "top_k")] <= ops[(b, "full")] for b in (1, 2))
    assert "before (kernels, busy ms)" in done.stdout and "best" in done.stdout


def test_kernel_families_and_classes() -> None:
    vec = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)"
    assert family(vec) == "at::native::vectorized_elementwise_kernel"
    assert kernel_class(vec) == "elementwise"
    anon = "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 3>(int)"
    assert family(anon) == "at::native::anon::CatArrayBatchedCopy"
    assert kernel_class("void implicit_convolve_sgemm<float, float, 128, 5, 5>(int, int)") == "conv"
    assert kernel_class("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3") == "attention"
    assert kernel_class("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT") == "gemm"
    assert kernel_class("add_rmsnorm_kernel") == "triton"
    assert kernel_class("void cub::DeviceRadixSortOnesweepKernel<int>(int)") == "sort"
