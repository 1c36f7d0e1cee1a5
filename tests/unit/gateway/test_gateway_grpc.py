"""The public gRPC face against stage doubles: whole clips, streamed text, voices, Converse."""

from __future__ import annotations

import asyncio
import io

import grpc
import numpy as np
import pytest
import soundfile as sf
from gateway_fakes import SAMPLES_PER_FRAME, expected_samples
from gateway_kit import SPEAKERS, MakeStack

from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


def config(**kw: object) -> speech_pb2.SynthesisConfig:
    kw.setdefault("encoding", PCM)
    return speech_pb2.SynthesisConfig(**kw)  # type: ignore[arg-type]


async def test_synthesize_returns_whole_clip_of_expected_length(make_stack: MakeStack) -> None:
    stack = await make_stack()
    text = "Hello there, world."
    reply = await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config(voice="ryan"), text=text))
    assert reply.encoding == PCM and reply.sample_rate_hz == 24_000 and reply.channels == 1
    assert len(reply.audio) == 2 * expected_samples(text)
    assert reply.summary.sample_count == expected_samples(text)
    assert reply.summary.finish_reason == speech_pb2.FINISH_REASON_END_OF_SPEECH
    pcm = np.frombuffer(reply.audio, "<i2")
    assert np.abs(pcm).max() > 5000  # the scripted tone, not silence
    op = stack.codec.opens[-1]
    assert op.voice == "ryan" and op.talker_address == stack.talker.address
    assert op.model == "qwen3-tts-tiny"
    await asyncio.sleep(0.05)
    assert stack.codec.half_closed_after_terminal == 1  # the gateway half-closes once it has the terminal


async def test_credit_is_returned_chunk_by_chunk(make_stack: MakeStack) -> None:
    # 150 frames do not fit the initial window (1 + 2 x 25 frames): the codec can only finish because the
    # gateway grants each delivered chunk's samples back.
    stack = await make_stack()
    text = "z" * 150
    reply = await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config(), text=text))
    assert len(reply.audio) == 2 * expected_samples(text)
    window = stack.codec.opens[-1].initial_credit.amount
    assert window == 51 * SAMPLES_PER_FRAME
    # Every chunk written is granted back, except those read after the terminal (nothing is written then).
    assert expected_samples(text) - window <= sum(stack.codec.credits) <= expected_samples(text)
    assert max(stack.codec.credits) <= 25 * SAMPLES_PER_FRAME  # one chunk at a time, never a blanket grant


async def test_synthesize_wav_resampled_and_defaults_voice(make_stack: MakeStack) -> None:
    stack = await make_stack()
    text = "abcdefghij" * 3
    request = speech_pb2.SynthesizeRequest(
        config=config(encoding=speech_pb2.AUDIO_ENCODING_WAV, sample_rate_hz=16_000, language="en-US"),
        text=text,
    )
    reply = await stack.stub.Synthesize(request)
    pcm, rate = sf.read(io.BytesIO(reply.audio), dtype="float32")
    assert rate == 16_000 and reply.sample_rate_hz == 16_000
    assert abs(len(pcm) - expected_samples(text) * 2 // 3) <= 2
    op = stack.codec.opens[-1]
    assert op.voice == "serena"  # the checkpoint's first preset speaker
    assert op.language == "english"  # BCP-47 mapped to the checkpoint's language name


async def test_synthesize_opus_whole_clip(make_stack: MakeStack) -> None:
    stack = await make_stack()
    reply = await stack.stub.Synthesize(
        speech_pb2.SynthesizeRequest(
            config=config(encoding=speech_pb2.AUDIO_ENCODING_OGG_OPUS), text="opus test"
        )
    )
    assert reply.audio[:4] == b"OggS"
    pcm, rate = sf.read(io.BytesIO(reply.audio), dtype="float32")
    assert rate == 24_000 and abs(len(pcm) - expected_samples("opus test")) < 2000


async def test_streaming_synthesize_segments_and_format_echo(make_stack: MakeStack) -> None:
    stack = await make_stack()

    async def requests():  # type: ignore[no-untyped-def]
        yield speech_pb2.StreamingSynthesizeRequest(
            config=config(encoding=speech_pb2.AUDIO_ENCODING_PCM_F32LE, sample_rate_hz=48_000, voice="vivian")
        )
        yield speech_pb2.StreamingSynthesizeRequest(text="Hello ")
        yield speech_pb2.StreamingSynthesizeRequest(text="world.")
        yield speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush())
        yield speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush())  # empty: no extra segment
        yield speech_pb2.StreamingSynthesizeRequest(text="Second one")

    responses = [r async for r in stack.stub.StreamingSynthesize(requests())]
    kinds = [r.WhichOneof("response") for r in responses]
    assert kinds[0] == "started" and kinds[-1] == "summary"
    started = responses[0].started
    assert started.encoding == speech_pb2.AUDIO_ENCODING_PCM_F32LE
    assert started.sample_rate_hz == 48_000 and started.channels == 1 and started.voice == "vivian"
    audio = [r.audio for r in responses if r.HasField("audio")]
    total = sum(len(a.data) for a in audio) // 4
    native = expected_samples("Hello world.") + expected_samples("Second one")
    assert abs(total - 2 * native) <= 4
    offsets = [a.sample_offset for a in audio]
    assert offsets == sorted(offsets) and offsets[0] == 0
    # The first chunk follows the deploy file's initial_codec_chunk_frames (1 frame), resampled to 48 kHz.
    assert len(audio[0].data) // 4 <= 2 * SAMPLES_PER_FRAME
    done = [r.segment_done for r in responses if r.HasField("segment_done")]
    assert [d.segment_index for d in done] == [0, 1]
    assert kinds.index("segment_done") > max(
        i for i, k in enumerate(kinds) if k == "audio" and responses[i].audio.segment_index == 0
    )
    summary = responses[-1].summary
    assert summary.segment_count == 2 and summary.sample_count == total
    assert summary.time_to_first_audio.ToNanoseconds() > 0


async def test_streaming_wav_header_in_first_chunk(make_stack: MakeStack) -> None:
    stack = await make_stack()

    async def requests():  # type: ignore[no-untyped-def]
        yield speech_pb2.StreamingSynthesizeRequest(config=config(encoding=speech_pb2.AUDIO_ENCODING_WAV))
        yield speech_pb2.StreamingSynthesizeRequest(text="wave")

    chunks = [r.audio.data async for r in stack.stub.StreamingSynthesize(requests()) if r.HasField("audio")]
    assert chunks[0][:4] == b"RIFF" and b"".join(chunks[1:])[:4] != b"RIFF"
    assert len(b"".join(chunks)) == 44 + 2 * expected_samples("wave")


async def test_list_voices_from_checkpoint_config(make_stack: MakeStack) -> None:
    stack = await make_stack()
    reply = await stack.stub.ListVoices(speech_pb2.ListVoicesRequest())
    assert [v.name for v in reply.voices] == SPEAKERS
    assert all(v.model == "qwen3-tts-tiny" and v.native_sample_rate_hz == 24_000 for v in reply.voices)
    assert "english" in reply.voices[0].languages and "sichuan_dialect" not in reply.voices[0].languages
    assert "sichuan" in reply.voices[3].description
    french = await stack.stub.ListVoices(speech_pb2.ListVoicesRequest(language="fr"))
    assert list(french.voices) == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.ListVoices(speech_pb2.ListVoicesRequest(model="tts-1"))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND and "tts-1" in err.value.details()


async def test_converse_names_the_deploy_setting_in_turn_mode(make_stack: MakeStack) -> None:
    stack = await make_stack()

    async def requests():  # type: ignore[no-untyped-def]
        yield speech_pb2.ConverseRequest(session_update=speech_pb2.SessionUpdate())

    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stack.stub.Converse(requests()):
            pass
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "session_mode: duplex" in (err.value.details() or "")


async def test_auto_flush_cuts_segments_at_sentence_ends(make_stack: MakeStack) -> None:
    # gateway.auto_flush: sentence: a client that streams deltas without flushing still gets one segment
    # per sentence, split inside a delta where the sentence ends.
    stack = await make_stack(overrides=["gateway.auto_flush=sentence"])

    async def requests():  # type: ignore[no-untyped-def]
        yield speech_pb2.StreamingSynthesizeRequest(config=config())
        for delta in ("Hello", " world.", " How are", " you? Fine", "."):
            yield speech_pb2.StreamingSynthesizeRequest(text=delta)

    responses = [r async for r in stack.stub.StreamingSynthesize(requests())]
    done = [r.segment_done for r in responses if r.HasField("segment_done")]
    assert [d.segment_index for d in done] == [0, 1, 2]
    audio = sum(len(r.audio.data) for r in responses if r.HasField("audio")) // 2
    native = sum(expected_samples(t) for t in ("Hello world.", " How are you?", " Fine."))
    assert abs(audio - native) <= 4
    assert responses[-1].summary.segment_count == 3
