"""``voxstage talk IN.wav -o OUT.wav``: a full-duplex conversation with a running gateway, from a file.

IN.wav (any rate, mono or stereo) is resampled to 24 kHz and streamed in real time, one 80 ms frame every
80 ms, as a microphone would; ``--tone SECONDS`` sends a 220 Hz tone of that length instead, for a first
try without a recording. The agent's audio is written to OUT.wav (24 kHz, 16-bit) and its transcript to
stdout (or ``--transcript FILE``). After the last frame the session is closed cleanly, so the agent's answer
to the end of the input still arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import wave
from pathlib import Path

import numpy as np

from voxstage.client._common import add_connection_options, connection_options
from voxstage.duplex import FRAME_SAMPLES, FRAME_SECONDS
from voxstage.duplex import SAMPLE_RATE as MODEL_RATE

EXIT_FAILED = 1
EXIT_INVALID = 2
MAX_TONE_S = 600.0  # ten minutes of a test tone is already more than a try needs


def load_input(path: Path) -> bytes:
    """IN.wav as 24 kHz mono 16-bit PCM bytes (what a ``pcm`` session takes)."""
    import soundfile as sf

    from voxstage.audio import float_to_s16, resample

    pcm, rate = sf.read(str(path), dtype="float32", always_2d=True)
    mono = pcm.mean(axis=1) if pcm.shape[1] > 1 else pcm[:, 0]
    return float_to_s16(resample(np.ascontiguousarray(mono), int(rate), MODEL_RATE)).tobytes()


def tone(seconds: float, hz: float = 220.0) -> bytes:
    """A sine tone as 24 kHz mono 16-bit PCM bytes: input for a first try without a recording."""
    t = np.arange(round(seconds * MODEL_RATE)) / MODEL_RATE
    return (3000 * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()


def write_wav(path: Path, pcm16: bytes) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(MODEL_RATE)
        w.writeframes(pcm16)


async def _talk(args: argparse.Namespace, data: bytes) -> int:
    from voxstage.client import AgentAudio, AgentTranscript, AsyncSpeechClient, ResponseDone, ServerNotice

    frame_bytes = FRAME_SAMPLES * 2
    audio = bytearray()
    transcript: list[str] = []
    done: ResponseDone | None = None
    start = time.monotonic()
    options: dict[str, object] = {"seed": args.seed} if args.seed is not None else {}
    if args.voice_audio is not None:
        options["voice_audio"] = args.voice_audio.read_bytes()
    async with (
        AsyncSpeechClient(args.addr, timeout=None, **connection_options(args)) as client,
        client.converse(voice=args.voice, instructions=args.instructions, **options) as session,
    ):

        async def send() -> None:
            t0 = time.monotonic()
            for i, offset in enumerate(range(0, len(data), frame_bytes)):
                await asyncio.sleep(max(t0 + i * FRAME_SECONDS - time.monotonic(), 0.0))
                await session.send_audio(data[offset : offset + frame_bytes])
            await session.close()

        sender = asyncio.create_task(send())
        try:
            async for event in session:
                if isinstance(event, AgentAudio):
                    audio += event.data
                elif isinstance(event, AgentTranscript):
                    transcript.append(event.text)
                    if args.transcript is None:
                        print(event.text, end="", flush=True)
                elif isinstance(event, ServerNotice):
                    print(f"\nvoxstage talk: server: {event.code}: {event.message}", file=sys.stderr)
                elif isinstance(event, ResponseDone):
                    done = event
        finally:
            sender.cancel()
    write_wav(args.output, bytes(audio))
    if args.transcript is not None:
        args.transcript.write_text("".join(transcript))
    elif transcript:
        print()
    status = "" if done is None else f", {done.status}" + (f" ({done.reason})" if done.reason else "")
    agent_s, input_s = len(audio) / 2 / MODEL_RATE, len(data) / 2 / MODEL_RATE
    print(
        f"{args.output}: {agent_s:.2f} s of agent audio for {input_s:.2f} s of input in "
        f"{time.monotonic() - start:.2f} s{status}",
        file=sys.stderr,
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    from voxstage.client import SpeechError

    if args.output.suffix.lower() != ".wav":
        print("voxstage talk: -o: write a .wav file", file=sys.stderr)
        return EXIT_INVALID
    # libsndfile says "System error" for a file that is not there: name the problem before it is asked.
    for path in (args.input, args.voice_audio):
        if path is not None and not path.is_file():
            print(f"voxstage talk: {path}: no such file", file=sys.stderr)
            return EXIT_INVALID
    if args.tone is not None:
        if not 0 < args.tone <= MAX_TONE_S:
            print(f"voxstage talk: --tone: seconds must be in (0, {MAX_TONE_S:g}]", file=sys.stderr)
            return EXIT_INVALID
        data = tone(args.tone)
    else:
        try:
            data = load_input(args.input)
        except Exception as exc:  # soundfile raises its own types for unreadable files
            print(f"voxstage talk: {args.input}: cannot read audio ({exc})", file=sys.stderr)
            return EXIT_INVALID
    if not data:
        print(f"voxstage talk: {args.input}: holds no audio", file=sys.stderr)
        return EXIT_INVALID
    try:
        return asyncio.run(_talk(args, data))
    except SpeechError as exc:
        print(f"voxstage talk: {exc}", file=sys.stderr)
        return EXIT_FAILED


def add_talk(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "talk", help="converse (full duplex) with a running gateway from a WAV file", description=__doc__
    )
    said = parser.add_mutually_exclusive_group(required=True)
    said.add_argument("input", type=Path, nargs="?", metavar="IN.wav", help="what the user says (any rate)")
    said.add_argument(
        "--tone", type=float, metavar="SECONDS", help="say a 220 Hz tone of this length instead of IN.wav"
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, metavar="OUT.wav", help="the agent's audio"
    )
    parser.add_argument("--addr", default="localhost:50051", help="gateway gRPC address (host:port)")
    add_connection_options(parser)
    parser.add_argument("--voice", default="", help="stored voice name; default: the model's")
    parser.add_argument(
        "--voice-audio", type=Path, default=None, metavar="VOICE.wav",
        help="a recording of the voice to speak with (at most 30 s), instead of a stored voice",
    )  # fmt: skip
    parser.add_argument("--instructions", default="", help="the persona (text prompt)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed, for a reproducible agent")
    parser.add_argument(
        "--transcript", type=Path, default=None, help="write the agent's transcript here instead of stdout"
    )
    parser.set_defaults(handler=_run)
