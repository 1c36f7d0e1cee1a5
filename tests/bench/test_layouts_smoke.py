"""Issue 31's command on CPU: ``bench/run_gpu.sh OUT --layout ...`` as a real process, tiny presets, tiny
levels. It checks what a CPU can: each layout's stack starts with its placement (``--set`` devices /
replica_devices), the pairs of ``pair-per-gpu`` both serve, the duplex model runs ``realtime`` in ``split``
and is skipped in ``pair-per-gpu``, and the report has one row per layout. Timing on CPU is no benchmark;
GPU busy is null without NVML. The report's rendering of GPU results is checked on the table's own rows."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import layout_report, layouts, run_gpu
from bench.serve_gpu import stack_spec
from voxstage.config import load_deploy_config
from voxstage.placement import place

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_split_layout_runs_as_one_command(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path / "run"
    cmd = ["bench/run_gpu.sh", str(out), "--models", "qwen3-tts-tiny,personaplex-tiny", "--layout", "split"]
    cmd += ["--phases", "closed,realtime,report", "--profile", "smoke", "--device", "cpu", "--threads", "1"]
    cmd += ["--slots", "2", "--frames", "10", "--realtime-levels", "1", "--realtime-seconds", "1"]
    cmd += ["--client-procs", "1"]
    # The box's install steps are skipped (VX_INSTALLED) and the checkout's own packages serve, as on the
    # device after `bench/run_gpu.sh --install-only`.
    env = {**os.environ, "VX_INSTALLED": "1", "PYTHON": sys.executable}
    env |= {"VX_PKG": str(tmp_path / "none"), "VX_SITE": str(tmp_path / "none")}
    env |= {"VOXSTAGE_CACHE": str(tmp_path_factory.getbasetemp() / "vxcache")}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=170)
    log = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, log[-4000:]

    split = load(out / "serve_tiny_split.json")
    assert split["layout"] == "split" and split["exit_code"] == 0
    assert {"stages.0.devices=0", "stages.1.devices=1"} <= set(split["command"])
    doc = load(out / "closed_search_tiny_split.json")
    assert doc["levels"] and all(lv["aggregate"]["errors"] == 0 for lv in doc["levels"])
    assert {"talker", "codec", "gateway"} <= set(doc["levels"][0]["processes"]["processes"])
    rt = load(out / "realtime_personaplex-tiny_split.json")
    assert {"stages.0.devices=0", "stages.1.devices=1"} <= set(rt["command"])
    (level,) = rt["levels"]
    assert level["sessions"] == 1 and level["errors"] == 0 and level["agent_frames"] > 0

    summary = load(out / "layouts.json")
    assert list(summary) == ["personaplex-tiny_split", "tiny_split"]
    assert summary["personaplex-tiny_split"]["realtime"]["late_frames"] == {"1": level["client_late_frames"]}
    assert summary["tiny_split"]["closed"]["levels"] and summary["tiny_split"]["slots"] == 2
    table = (out / "layouts.md").read_text()
    assert table.count("\n") == 2 + 2 and "split: talker on GPU 0, codec on GPU 1" in table
    assert table in (out / "summary.md").read_text()


PLACED = {  # layout -> (talker replicas' CUDA_VISIBLE_DEVICES, codecs') under a launcher that sees 4,5
    "one-gpu": (["4"], ["4"]),
    "split": (["4"], ["5"]),
    "pair-per-gpu": (["4", "5"], ["4", "5"]),
}


@pytest.mark.parametrize("name", list(PLACED))
@pytest.mark.parametrize("model", ["qwen3-tts-tiny", "personaplex-tiny"])
def test_layout_places_the_stages_on_a_gpu_host(
    name: str, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack a layout starts, loaded as ``voxstage serve`` loads it for a GPU platform (the per-GPU
    memory check included) and placed as it places it."""
    layout = layouts.LAYOUTS[name]
    ns = argparse.Namespace(chunk_schedule="", device="cuda", frames=10, max_model_len=None, threads=None)
    own = "stages.0.max_model_len=512"  # the run's own --set, kept before the layout's
    ns.set, ns.pairs, ns.pair_memory_fraction, ns.pairs_share_device = [own], 1, None, True
    a = layouts.options(ns, layout)
    assert ns.set == [own] and a.set[0] == own and a.layout_name == name  # ns is left as it was
    fam = run_gpu.family_of(model)
    spec = stack_spec(a, model, fam, 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    config = load_deploy_config(fam.deploy, platform="cuda", overrides=spec.sets())
    talkers, codecs = place(config, "127.0.0.1")
    assert ([t.visible for t in talkers], [c.visible for c in codecs]) == PLACED[name]
    assert config.talker.max_num_seqs == config.codec.max_num_seqs == 8 // layout.pairs
    assert config.talker.max_model_len == 512
    # One talker and one codec per GPU in every layout: each keeps the deploy file's GPU fraction.
    seed = load_deploy_config(fam.deploy, platform="cuda")
    for stage, ref in ((config.talker, seed.talker), (config.codec, seed.codec)):
        assert stage.gpu_memory_utilization == ref.gpu_memory_utilization


def _level(n: float, ok: bool, busy: dict[str, float]) -> dict:
    gpu = {"busy_pct": {d: {"mean": v} for d, v in busy.items()}, "error": None}
    return {"level": n, "verdict": {"pass": ok}, "processes": {"gpu": gpu}}


def test_report_row_reads_the_busiest_passing_level_per_device() -> None:
    closed = {"search": {"best": 64.0, "limited_by": "gate"}, "levels": []}
    closed["levels"] = [_level(32, True, {"0": 40, "1": 20}), _level(64, True, {"0": 70, "1": 35})]
    closed["levels"].append(_level(128, False, {"0": 99, "1": 60}))
    got = layout_report._closed(closed)
    assert got is not None and got["gpu_busy_pct"] == {"0": 70, "1": 35} and got["gpu_busy_at"] == 64
    rt_levels = [{"sessions": n, "client_late_frames": late, "errors": 0} for n, late in ((32, 0), (64, 3))]
    rt = layout_report._duplex({"levels": rt_levels})
    assert rt is not None and rt["most_sessions_without_late_frames"] == 32 and rt["gpu_busy_at"] == 32
    row = layout_report.row("0.6b_split", {"closed": got, "realtime": None, "c1_rtf_p50": 0.07})
    assert row[4] == "64 (gate)" and row[6] == "GPU 0: 70 / GPU 1: 35 (at 64 streams)" and row[3] == "0.070"


def test_layout_names_are_checked() -> None:
    assert [la.name for la in layouts.parse("one-gpu,split")] == ["one-gpu", "split"]
    with pytest.raises(SystemExit, match="unknown two-gpu"):
        layouts.parse("split,two-gpu")
    with pytest.raises(SystemExit, match="twice"):
        layouts.parse("split,split")
    assert layouts.layout_of("0.6b_pair-per-gpu") == ("0.6b", layouts.LAYOUTS["pair-per-gpu"])
    assert layouts.layout_of("0.6b_2pairs") == ("0.6b_2pairs", None)
