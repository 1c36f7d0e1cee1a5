"""One format table for every face: HTTP ``response_format``, gRPC ``AudioEncoding``, the SDK's ``encoding``
and ``voxstage say -o FILE`` accept the same formats, read from ``voxstage.formats``, and docs/api.md's
"Output formats" table is that table."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
from gateway_fakes import expected_samples
from gateway_kit import MakeStack

from gateway.grpc import speech as grpc_api
from gateway.http import speech as http_speech
from voxstage import formats
from voxstage.audio import AudioFormat, StreamingEncoder, decode_audio, encode_clip
from voxstage.client import AsyncSpeechClient
from voxstage.client import _common as sdk
from voxstage.client import cli as say
from voxstage.v1 import speech_pb2

REPO = Path(__file__).resolve().parents[3]
TABLE = set(formats.NAMES)


def test_every_face_offers_the_same_formats() -> None:
    http = set(typing.get_args(http_speech.SpeechRequest.model_fields["response_format"].annotation))
    assert str in http  # a string checked against the table, never a second list of names
    assert {f.value for f in AudioFormat} == TABLE
    assert {fmt.value for fmt in grpc_api.ENCODINGS.values()} == TABLE
    assert {speech_pb2.AudioEncoding.Name(e) for e in grpc_api.ENCODINGS} == {
        f.encoding_name for f in formats.FORMATS
    }
    # every public enum value but UNSPECIFIED is a format
    assert set(speech_pb2.AudioEncoding.keys()) - {"AUDIO_ENCODING_UNSPECIFIED"} == {
        f.encoding_name for f in formats.FORMATS
    }
    assert set(sdk.ENCODINGS) == TABLE and set(typing.get_args(sdk.Encoding)) == TABLE
    assert set(say.SUFFIXES.values()) == TABLE
    assert {say._encoding(f"out{suffix}") for suffix in say.SUFFIXES} == TABLE


def _doc_rows() -> list[str]:
    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("\n## Output formats\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_api_doc_lists_the_table() -> None:
    expected = [
        f"| `{f.name}` | `{f.encoding_name}` | {', '.join(f'`{s}`' for s in f.suffixes)} | "
        f"{f.streams_text()} | {f.rates_text()} | `{f.content_type}` | {f.note} |"
        for f in formats.FORMATS
    ]
    assert _doc_rows() == expected


@pytest.mark.parametrize("fmt", [AudioFormat.MP3, AudioFormat.OPUS])
def test_compressed_streams_decode_like_the_whole_clip(fmt: AudioFormat) -> None:
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(24_000) / 24_000)).astype(np.float32)
    encoder = StreamingEncoder(fmt, 24_000)
    pieces = [encoder.encode(tone[k : k + 1920]) for k in range(0, tone.size, 1920)]
    assert sum(bool(p) for p in pieces[:5]) >= 3  # bytes leave as audio is made, not at the end
    streamed, _ = decode_audio(b"".join(pieces) + encoder.close(), max_bytes=10**7)
    whole, _ = decode_audio(encode_clip(tone, fmt, 24_000), max_bytes=10**7)
    assert tone.size <= streamed.size <= tone.size + 3000 and tone.size <= whole.size <= tone.size + 3000


async def test_grpc_sdk_and_cli_take_mp3_and_flac(make_stack: MakeStack, tmp_path: Path) -> None:
    stack = await make_stack()
    text = "mp3 and flac"
    for name in ("mp3", "flac"):
        config = speech_pb2.SynthesisConfig(encoding=formats.BY_NAME[name].encoding)
        reply = await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text=text))
        pcm, rate = decode_audio(reply.audio, max_bytes=10**7)
        assert rate == 24_000 and abs(pcm.size - expected_samples(text)) < 2000
    async with AsyncSpeechClient(stack.grpc_addr) as client:
        audio = await client.synthesize(text, encoding="flac")
        assert audio.encoding == "flac" and audio.data[:4] == b"fLaC"
        chunks = [chunk async for chunk in client.stream(text, encoding="mp3")]
    pcm, _ = decode_audio(b"".join(c.data for c in chunks), max_bytes=10**7)
    assert pcm.size >= expected_samples(text)
    for name, extra in (
        ("x.mp3", ()),
        ("x.flac", ()),
        ("x.mp3", ("--stream",)),
        ("x.bin", ("--format", "flac")),
    ):
        out = tmp_path / name
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "voxstage", "say", text, "-o", str(out), "--addr", stack.grpc_addr, *extra,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log, _ = await proc.communicate()
        assert proc.returncode == 0, log.decode()
        pcm, _ = decode_audio(out.read_bytes(), max_bytes=10**7)
        assert 0 <= pcm.size - expected_samples(text) < 3000, (name, extra)  # mp3 adds the encoder delay
