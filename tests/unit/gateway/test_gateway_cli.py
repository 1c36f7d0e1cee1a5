"""``voxstage say`` and ``voxstage gateway`` as commands; the gateway process stays free of model code."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
from pathlib import Path

import soundfile as sf
from gateway_fakes import expected_samples
from gateway_kit import SEED, MakeStack


async def run(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "voxstage", *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_say_whole_and_streamed(make_stack: MakeStack, tmp_path: Path) -> None:
    stack = await make_stack()
    text = "Say it"
    out = tmp_path / "out.wav"
    code, log = await run("say", text, "-o", str(out), "--addr", stack.grpc_addr, "--voice", "eric")
    assert code == 0, log
    pcm, rate = sf.read(out)
    assert rate == 24_000 and len(pcm) == expected_samples(text)
    assert stack.codec.opens[-1].voice == "eric"
    streamed = tmp_path / "streamed.wav"
    code, log = await run("say", text, "-o", str(streamed), "--addr", stack.grpc_addr, "--stream",
                          "--sample-rate", "16000")  # fmt: skip
    assert code == 0 and "first audio after" in log, log
    pcm, rate = sf.read(io.BytesIO(streamed.read_bytes()))  # the streamed header got its real sizes
    assert rate == 16_000 and abs(len(pcm) - expected_samples(text) * 2 // 3) <= 2


async def test_say_reports_errors(make_stack: MakeStack, tmp_path: Path) -> None:
    stack = await make_stack()
    code, log = await run("say", "x", "-o", str(tmp_path / "a.mp4"), "--addr", stack.grpc_addr)
    assert code == 2 and "cannot tell the format" in log
    code, log = await run(
        "say", "x", "-o", str(tmp_path / "a.wav"), "--addr", stack.grpc_addr, "--voice", "zed"
    )
    assert code == 1 and "NOT_FOUND" in log and "zed" in log


async def test_gateway_command_rejects_bad_flags() -> None:
    code, log = await run("gateway", "--config", str(SEED), "--codec", "nohost", "--talker", "a:1")
    assert code == 2 and "--codec: 'nohost' is not host:port" in log
    code, log = await run("gateway", "--config", str(SEED), "--codec", "a:1", "--talker", "a:1",
                          "--set", "gateway.max_queue=-1")  # fmt: skip
    assert code == 2 and "gateway.max_queue" in log


async def test_gateway_imports_no_model_code() -> None:
    probe = (
        "import sys, voxstage.launch.cli, gateway.app, voxstage.client; "
        "mods = ('torch', 'services.talker.engine', 'services.codec.engine'); "
        "bad = [m for m in mods if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", probe, stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
