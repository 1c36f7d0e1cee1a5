"""Seeded outputs of the three families' tiny presets, as the stages compute them, reduced to hashes.

Each family is loaded the way its stage processes load it (preset materialized into a cache directory,
the family's talker and codec loaders, the deploy file's settings), requests are built from wire-level
parameters by the stage's own worker, and the engines run them in-process:

* text-to-speech (``qwen3-tts-tiny``, ``-base`` with a cloned voice, ``-voice-design``, ``audio8-tts-tiny``
  also with a voice cloned from codes): two seeded requests batched in one talker engine, then each one's
  codes decoded into PCM by the codec engine the deploy file configures (voice-clone reference codes as
  the decode prefix, as the codec stream sends them);
* full duplex (``personaplex-tiny``): a user recording encoded by the duplex codec's Mimi pool, a seeded
  session with a stored voice and a persona stepped frame by frame, and its agent codes decoded to PCM.

``fingerprints()`` returns ``name -> sha256`` of each integer array (codes and tokens: dtype, shape and
bytes), and for PCM a sketch (its length and each of 64 segments' mean and RMS): the last float bits of a
decoder's output depend on the CPU's vector width (the same code gives other PCM bits on an AVX-512 and an
AVX2 machine), so PCM is compared within ``PCM_RTOL`` of its peak, codes bit for bit. The stored code hashes
in ``tests/fixtures/fingerprint.json`` were computed on the code before the issue-25 restructure, so the
test proves that moving code changed no sampled code. ``python -m tests.fingerprint --write`` rewrites the
file (only ever on purpose: a change that alters outputs must say why).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.codec.main import build_engine
from services.codec.models import load_codec, load_duplex_codec
from services.talker.duplex.engine import DuplexConfig, DuplexEngine
from services.talker.duplex.worker import DuplexWorker
from services.talker.engine import EngineConfig, TalkerEngine
from services.talker.models import load_talker
from services.talker.request_params import request_params
from services.talker.worker import TalkerDefaults, TalkerWorker
from voxstage import wire
from voxstage.config import load_deploy_config
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.presets import resolve_model

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "tests" / "fixtures" / "fingerprint.json"
TEXTS = ("Hello there, this is a fingerprint.", "A second voice joins the batch.")
MAX_FRAMES = 20
MAX_TICKS = 2000
# (preset, deploy file, what each of the two requests asks for beyond its text and seed)
TTS_CASES: dict[str, tuple[str, tuple[dict[str, Any], dict[str, Any]]]] = {
    "qwen3-tts-tiny": ("qwen3_tts.yaml", ({"voice": "first"}, {"voice": "last", "language": "english"})),
    "qwen3-tts-tiny-base": ("qwen3_tts.yaml", ({"clone": "x-vector"}, {"clone": "icl"})),
    "qwen3-tts-tiny-voice-design": ("qwen3_tts.yaml", ({"instructions": "Speak calmly."}, {})),
    "audio8-tts-tiny": ("audio8_tts.yaml", ({}, {"clone": "icl"})),
}


PCM_SEGMENTS = 64
PCM_RTOL = 1e-4  # of the sketch's largest value: far above CPU rounding, far below any real change


def digest(array: np.ndarray) -> str:
    a = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def sketch(pcm: np.ndarray) -> list[float]:
    """Length, then each segment's mean and RMS (float64): stable across CPUs, moved by any real change."""
    x = np.asarray(pcm, np.float64).reshape(-1)
    parts = np.array_split(x, PCM_SEGMENTS)
    return [float(x.size)] + [float(v) for p in parts for v in (p.mean(), np.sqrt((p * p).mean()))]


def same(found: str | list[float], expected: str | list[float]) -> bool:
    if isinstance(expected, str) or isinstance(found, str):
        return found == expected
    a, b = np.asarray(found), np.asarray(expected)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=0, atol=PCM_RTOL * np.abs(b[1:]).max()))


def _recording(seed: int, seconds: float, rate: int) -> np.ndarray:
    """Band-limited noise with a slow envelope, well inside [-1, 1] (float32 mono)."""
    n = int(seconds * rate)
    x = np.random.default_rng(seed).standard_normal(n + 31).astype(np.float32)
    x = np.convolve(x, np.ones(32, np.float32) / 32, mode="valid")[:n]
    return (0.5 * x * (0.5 + 0.4 * np.sin(np.arange(n) / 3000.0))).astype(np.float32)


def _open(ask: dict[str, Any], seed: int, info: Any, runtime: Any) -> tuple[S.StreamOpen, np.ndarray | None]:
    """The talker's ``open`` as the codec would forward it, and the reference codes it decodes first."""
    op = S.StreamOpen(request_id="fp", mode=S.STREAM_MODE_TTS, seed=seed)
    if "voice" in ask:
        op.voice = info.voices[0] if ask["voice"] == "first" else info.voices[-1]
    op.language = ask.get("language", "")
    op.instructions = ask.get("instructions", "")
    codes = None
    if "clone" in ask:
        pcm = _recording(seed, 1.5, 16000)
        icl = ask["clone"] == "icl"
        codes = runtime.encode_reference(pcm, 16000) if icl else None
        xvec = runtime.speaker_embedding(pcm, 16000)
        op.reference.CopyFrom(wire.voice_reference("A reference line." if icl else "", codes, xvec))
    return op, codes


def _drive(engine: Any, requests: list[Any]) -> dict[str, np.ndarray]:
    out: dict[str, list[np.ndarray]] = {r.request_id: [] for r in requests}
    for r in requests:
        engine.submit(r)
    for _ in range(MAX_TICKS):
        if not engine.has_work():
            break
        for o in engine.step():
            if o.codes.shape[0]:
                out[o.request_id].append(o.codes)
    else:
        raise AssertionError("talker engine did not finish")
    return {k: np.concatenate(v) for k, v in out.items()}


def _decode(codec: Any, key: str, codes: np.ndarray, prefix: np.ndarray | None) -> np.ndarray:
    codec.open(key, prefix=prefix)
    codec.push(key, codes)
    codec.finish(key)
    pcm: list[np.ndarray] = []
    for _ in range(MAX_TICKS):
        outs = codec.step()
        pcm += [o.pcm for o in outs]
        if any(o.final for o in outs):
            return np.concatenate(pcm)
    raise AssertionError("codec engine did not finish")


def tts(preset: str, cache: Path) -> dict[str, str | list[float]]:
    deploy, asks = TTS_CASES[preset]
    config = load_deploy_config(ROOT / "deploy" / deploy, platform="cpu")
    source = resolve_model(preset, cache=cache)
    adapter, info = load_talker(source, device="cpu", dtype=torch.float32)
    runtime = load_codec(
        source, device="cpu", dtype=torch.float32, max_streams=config.codec.max_num_seqs, config=config
    )
    stage = config.talker
    engine = TalkerEngine(
        adapter,
        EngineConfig(max_num_seqs=2, max_model_len=512, max_num_batched_tokens=stage.batched_token_budget),
    )
    worker = TalkerWorker(engine, info, TalkerDefaults.from_deploy(stage, info))
    requests, prefixes = [], {}
    for i, (ask, text) in enumerate(zip(asks, TEXTS, strict=True)):
        op, prefix = _open(ask, 42 + i, info, runtime)
        params = request_params(op)
        worker.check_voice(params)
        key = f"{preset}/{i}"
        requests.append(worker.build_request(key, params, text, True, max_frames=MAX_FRAMES))
        prefixes[key] = prefix
    codes = _drive(engine, requests)
    codec = build_engine(config, runtime, "cpu")
    out: dict[str, str | list[float]] = {}
    for key, frames in codes.items():
        out[f"{key}/codes"] = digest(frames)
        out[f"{key}/pcm"] = sketch(_decode(codec, key, frames, prefixes[key]))
    return out


def duplex(cache: Path) -> dict[str, str | list[float]]:
    preset = "personaplex-tiny"
    config = load_deploy_config(ROOT / "deploy" / "personaplex.yaml", platform="cpu")
    source = resolve_model(preset, cache=cache)
    adapter, info = load_talker(source, device="cpu", dtype=torch.float32)
    codec = load_duplex_codec(source, device="cpu", dtype=torch.float32, max_sessions=1).codec
    stage = config.talker
    engine = DuplexEngine(
        adapter,  # type: ignore[arg-type]
        DuplexConfig(max_sessions=1, window=256, prefill_budget=stage.batched_token_budget),
        clock=lambda: 0.0,
    )
    worker = DuplexWorker(engine, info, TalkerDefaults.from_deploy(stage, info))
    op = S.StreamOpen(request_id="fp", mode=S.STREAM_MODE_DUPLEX, voice=info.voices[0], seed=5)
    op.instructions = "You enjoy a good conversation."
    engine.open(worker.build_request("s", request_params(op)))
    spf = codec.samples_per_frame
    frames = 8
    user = torch.from_numpy(_recording(3, frames * spf / codec.sample_rate, codec.sample_rate))[None]
    with torch.inference_mode():
        codec.reset(torch.tensor([0]))
        user_codes = codec.encode_packed(user, torch.tensor([frames]))[0].T.numpy()
    agent: list[np.ndarray] = []
    sent = 0
    for _ in range(MAX_TICKS):
        if engine.session_state("s") == "decode" and sent < frames:
            engine.push_user("s", sent, user_codes[sent : sent + 1])
            sent += 1
        agent += [o.tokens for o in engine.step() if o.finish is None]
        if len(agent) > frames:
            break
    tokens = np.stack(agent)
    with torch.inference_mode():
        codec.reset(torch.tensor([0]))
        agent_codes = torch.from_numpy(tokens[:, 1:].T.copy())[None]
        pcm = codec.decode_packed(agent_codes, torch.tensor([tokens.shape[0]]))[0].numpy()
    return {
        f"{preset}/user_codes": digest(user_codes),
        f"{preset}/agent_tokens": digest(tokens),
        f"{preset}/pcm": sketch(pcm),
    }


def fingerprints(cache: Path) -> dict[str, str | list[float]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one intra-op thread: the reduction order every run shares
    try:
        out: dict[str, str | list[float]] = {}
        for preset in TTS_CASES:
            out |= tts(preset, cache)
        return out | duplex(cache)
    finally:
        torch.set_num_threads(threads)


def stored() -> dict[str, str | list[float]]:
    return json.loads(STORED.read_text())


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {STORED.relative_to(ROOT)}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        found = fingerprints(Path(tmp))
    if args.write:
        text = json.dumps(found, sort_keys=True).replace("], ", "],\n ").replace('", ', '",\n ')
        STORED.write_text(text + "\n")  # a line per output
    print(json.dumps(found, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
