"""Duplex load generator (issue 12): N concurrent full-duplex sessions through the gateway's gRPC
``Converse``, each streaming real-time user audio, at several levels of N.

Each session opens ``Converse``, sets its voice and persona with ``session.update``, then sends one 80 ms
frame of 24 kHz pcm16 every 80 ms on an absolute schedule for ``--seconds``, and records the agent audio and
transcript deltas it receives. The levels, the playback as heard and every number of a level's row are
``bench/duplex_levels.py``'s, shared with the WebSocket face's load generator (``bench/realtime_loadgen.py``).

    python -m bench.duplex_loadgen --out duplex.json --device cuda --levels 1,8,32,64   # the size-true preset
    python -m bench.duplex_loadgen --out smoke.json --model TINY_PRESET --device cpu --levels 1,2 --seconds 3

The model and deploy file default to the duplex family's (``voxstage.families``): its size-true preset and
its seed deploy file.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from bench.duplex_levels import (
    RATE,
    SessionOptions,
    SessionRecord,
    paced,
    run_cli,
    user_frames,
)
from voxstage.v1 import speech_pb2 as P
from voxstage.v1 import speech_pb2_grpc


async def converse_session(target: str, seconds: float, seed: int, opts: SessionOptions) -> SessionRecord:
    rec = SessionRecord(time.monotonic())
    frames = user_frames(seconds, seed)
    pcm = P.RealtimeAudioFormat(encoding=P.AUDIO_ENCODING_PCM_S16LE, sample_rate_hz=RATE)
    update = P.Session(
        instructions=opts.persona,
        audio=P.SessionAudio(
            input=P.SessionAudioInput(format=pcm), output=P.SessionAudioOutput(format=pcm, voice=opts.voice)
        ),
        seed=seed,
    )
    out: asyncio.Queue[P.ConverseRequest | None] = asyncio.Queue()

    async def send(chunk: bytes) -> None:
        await out.put(P.ConverseRequest(input_audio_buffer_append=P.InputAudioBufferAppend(audio=chunk)))

    async def requests():  # type: ignore[no-untyped-def]
        yield P.ConverseRequest(session_update=P.SessionUpdate(session=update))
        while (item := await out.get()) is not None:
            yield item

    async def sender() -> None:
        await paced(frames, rec, send)
        await asyncio.sleep(opts.grace_s)  # let the last answers arrive before closing
        await out.put(None)

    async with grpc.aio.insecure_channel(target) as channel:
        call = speech_pb2_grpc.SpeechStub(channel).Converse(requests(), timeout=seconds + 120)
        task = asyncio.create_task(sender())
        try:
            async for event in call:
                kind = event.WhichOneof("event")
                now = time.monotonic()
                if kind == "response_output_audio_delta":
                    rec.audio.append((now, len(event.response_output_audio_delta.delta) // 2))
                elif kind == "response_output_audio_transcript_delta":
                    rec.transcript_chars += len(event.response_output_audio_transcript_delta.delta)
                elif kind == "session_updated":
                    rec.opened_at = now
                elif kind == "error":
                    rec.error(event.error.code or event.error.type, event.error.message)
        except grpc.aio.AioRpcError as exc:
            rec.error(exc.code().name, exc.details() or "")
        finally:
            task.cancel()
    return rec


def main() -> None:
    run_cli(__doc__, "1,8,32,64", "bench.duplex_loadgen", "converse_session", "grpc")


if __name__ == "__main__":
    main()
