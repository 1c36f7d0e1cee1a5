"""Duplex ``Codec.Stream`` (docs/protocol.md §11) in process: the real codec servicer, worker, engine thread
and tiny Mimi, against an in-test fake talker (a grpc.aio ``Talker`` that follows §11: ``opened`` with
user-code credit, the prompt's frame, one agent frame with a text token and transcript per user frame, its
terminal on ``end_of_input``). The engine ticks every 20 ms here so a session takes a fraction of a second.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codec_duplex_kit import CODE, MODEL, SPF, FakeTalker, Session, only_message, speech, stage

from services.codec.models.mimi.loader import random_init
from services.codec.models.mimi.model import MimiModel
from services.codec.models.mimi.presets import tiny_config
from services.codec.models.mimi.recording import prepare_reference
from voxstage.internal.v1 import stage_pb2 as S


@pytest.fixture(scope="module")
def model() -> MimiModel:
    return random_init(tiny_config(), seed=8)


async def test_a_session_relays_audio_codes_transcript_and_credits_and_ends_on_end_of_input(
    model: MimiModel,
) -> None:
    async with stage(model, FakeTalker()) as rig:
        s = Session(rig)
        s.send(open=rig.open_msg())
        opened = (await s.recv()).opened  # type: ignore[union-attr]
        assert (opened.family, opened.num_code_groups, opened.sample_rate_hz) == ("personaplex", 8, 24000)
        assert opened.initial_credit == S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=24000)
        s.send_audio(speech(0, 5))  # 5 frames in one message, within the 1 s grant
        await s.until(lambda m: m.HasField("pcm") and m.pcm.user_frame == 4)
        await s.until(lambda m: m.HasField("pcm") and m.pcm.user_frame == -1)  # silence fill again
        status = await rig.status()
        assert status.slots_in_use == 1 and status.requests[0].phase == S.REQUEST_PHASE_RUNNING
        s.send(end_of_input=S.EndOfInput())
        eos = (await s.until(lambda m: m.HasField("end_of_stream"))).end_of_stream
        await s.finish()
        assert eos.reason == S.END_REASON_EOS
        pcm = s.pcm()
        assert [p.first_frame for p in pcm] == list(range(len(pcm)))
        assert all(p.sample_count == SPF and p.frame_count == 1 for p in pcm)
        assert all(p.transcript_delta == f"w{p.first_frame} " for p in pcm)  # the talker's, per frame
        assert pcm[0].user_frame == -1  # the prompt's frame
        # Each of the 5 user frames answered once, in order, but for those the engine dropped because it ran
        # a tick late on a loaded box (by design: the audio of skipped ticks goes unheard), and no others.
        answered = [p.user_frame for p in pcm if p.user_frame >= 0]
        assert answered == sorted(set(answered)) and set(answered) <= set(range(5)) and answered[-1] == 4
        assert len(answered) == 5 - rig.unheard
        assert (eos.frame_count, eos.sample_count) == (len(pcm), len(pcm) * SPF)
        # The jitter buffer's freed samples come back in grants of at least a quarter of it (6,000 of the
        # 24,000): the 5 frames' 9,600 as one grant of 4 frames (or 5, where a late tick freed two at once).
        credits = [m.credit for m in s.got if m.HasField("credit")]
        assert [c.unit for c in credits] == [S.CREDIT_UNIT_SAMPLES]
        assert credits[0].amount in (4 * SPF, 5 * SPF)
        # What the talker got: the forwarded open, then one user frame per tick, then end_of_input.
        (op,) = rig.talker.opens
        assert op.mode == S.STREAM_MODE_DUPLEX and not op.talker_address and not op.sample_rate_hz
        assert (op.model, op.voice, op.instructions, op.seed) == (MODEL, "NATF0", "Be kind.", 3)
        assert op.initial_credit == S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=25)
        codes = rig.talker.user_codes
        assert [c.first_frame for c in codes] == list(range(len(codes))) and len(codes) >= len(pcm) - 1
        assert rig.talker.got[-1] == "end_of_input"
        assert (await rig.status()).slots_in_use == 0


async def test_agent_audio_is_resampled_to_the_requested_rate(model: MimiModel) -> None:
    async with stage(model, FakeTalker()) as rig:
        s = Session(rig)
        s.send(open=rig.open_msg(sample_rate_hz=16000, pcm_format=S.PCM_FORMAT_F32LE))
        assert (await s.recv()).opened.sample_rate_hz == 16000  # type: ignore[union-attr]
        await s.until(lambda m: m.HasField("pcm") and m.pcm.first_frame == 12)
        s.send(end_of_input=S.EndOfInput())
        await s.until(lambda m: m.HasField("end_of_stream"))
        await s.finish()
        pcm = s.pcm()
        total = sum(p.sample_count for p in pcm)
        assert all(p.format == S.PCM_FORMAT_F32LE for p in pcm)
        assert (
            len(pcm) * 1280 - 1280 < total <= len(pcm) * 1280
        )  # 80 ms per frame, less the resampler's delay


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"language": "en"}, "INVALID_ARGUMENT", "language:"),
        ({"non_streaming_mode": True}, "INVALID_ARGUMENT", "non_streaming_mode:"),
        ({"initial_text": "hi"}, "INVALID_ARGUMENT", "initial_text:"),
        ({"initial_end_of_input": True}, "INVALID_ARGUMENT", "initial_text:"),
        ({"chunk_schedule": S.ChunkSchedule(initial_chunk_frames=1)}, "INVALID_ARGUMENT", "chunk_schedule:"),
        ({"mode": S.STREAM_MODE_TTS}, "FAILED_PRECONDITION", "mode:"),
        ({"model": "qwen3-tts-tiny"}, "NOT_FOUND", "model:"),
        ({"talker_address": ""}, "INVALID_ARGUMENT", "talker_address:"),
        ({"sample_rate_hz": 96000}, "INVALID_ARGUMENT", "sample_rate_hz:"),
        (
            {"initial_credit": S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=100)},
            "INVALID_ARGUMENT",
            "initial_credit",
        ),
        ({"reference": S.VoiceReference(text="hi")}, "INVALID_ARGUMENT", "reference.text:"),
        (
            {"reference": S.VoiceReference(audio=S.Payload(inline=b"\0\0"), audio_format=S.PCM_FORMAT_S16LE)},
            "INVALID_ARGUMENT",
            "reference.audio_sample_rate_hz:",
        ),
        (
            {
                "reference": S.VoiceReference(
                    audio=S.Payload(inline=bytes(2 * 31 * 8000)),
                    audio_format=S.PCM_FORMAT_S16LE,
                    audio_sample_rate_hz=8000,
                )
            },
            "INVALID_ARGUMENT",
            "reference.audio: 31.0 s exceeds the limit of 30 s",
        ),
    ],
)
async def test_bad_opens_are_refused_naming_the_field(
    model: MimiModel, fields: dict[str, object], code: str, words: str
) -> None:
    async with stage(model, FakeTalker()) as rig:
        eos = await only_message(rig, rig.open_msg(**fields))
        assert eos.reason == S.END_REASON_ERROR and eos.error.code == CODE[code]
        assert words in eos.error.message and eos.error.origin == "codec"
        assert not rig.talker.opens and (await rig.status()).slots_in_use == 0


async def test_a_talker_refusal_is_the_codecs_only_message_unchanged(model: MimiModel) -> None:
    async with stage(model, FakeTalker(mode="refuse")) as rig:
        eos = await only_message(rig, rig.open_msg())
        assert eos.reason == S.END_REASON_ERROR
        assert (eos.error.code, eos.error.message, eos.error.origin) == (
            CODE["RESOURCE_EXHAUSTED"],
            "all 1 talker slots hold live sessions",
            "talker",
        )
        assert (await rig.status()).slots_in_use == 0


async def test_user_audio_beyond_the_grant_and_in_the_wrong_place_is_refused(model: MimiModel) -> None:
    async with stage(model, FakeTalker(), jitter=4 * SPF) as rig:
        s = Session(rig)
        s.send(open=rig.open_msg())
        assert (await s.recv()).opened.initial_credit.amount == 4 * SPF  # type: ignore[union-attr]
        s.send_audio(speech(0, 5))
        eos = (await s.until(lambda m: m.HasField("end_of_stream"))).end_of_stream
        await s.finish()
        assert eos.error.code == CODE["INVALID_ARGUMENT"]
        assert "user_audio: 9600 samples exceed the granted credit of 7680" in eos.error.message
        assert await rig.talker_cancelled()
        for kind, words in (("offset", "user_audio.sample_offset: expected 0, got 5"), ("text", "text:")):
            s = Session(rig)
            s.send(open=rig.open_msg())
            await s.recv()
            if kind == "offset":
                s.send(user_audio=S.PcmChunk(sample_offset=5, sample_count=1, format=S.PCM_FORMAT_S16LE))
            else:
                s.send(text="hello")
            eos = (await s.until(lambda m: m.HasField("end_of_stream"))).end_of_stream
            await s.finish()
            assert words in eos.error.message
        assert (await rig.status()).slots_in_use == 0


async def test_agent_audio_not_read_fails_the_session(model: MimiModel) -> None:
    async with stage(model, FakeTalker()) as rig:
        s = Session(rig)
        s.send(open=rig.open_msg(initial_credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=2 * SPF)))
        while (msg := await s.recv()) is not None and not msg.HasField("end_of_stream"):
            pass  # never grant: two frames go out, then the codec queues at most one window
        await s.finish()
        assert msg is not None
        eos = msg.end_of_stream
        assert eos.error.code == CODE["RESOURCE_EXHAUSTED"] and "agent audio not read" in eos.error.message
        assert len(s.pcm()) == 2 and await rig.talker_cancelled()
        assert (await rig.status()).slots_in_use == 0


async def test_cancel_ends_the_session_and_frees_its_slot(model: MimiModel) -> None:
    async with stage(model, FakeTalker()) as rig:
        s = Session(rig)
        s.send(open=rig.open_msg())
        await s.recv()
        await s.until(lambda m: m.HasField("pcm") and m.pcm.first_frame == 3)
        s.send(cancel=S.Cancel(reason="client went away"))
        eos = (await s.until(lambda m: m.HasField("end_of_stream"))).end_of_stream
        await s.finish()
        assert eos.reason == S.END_REASON_CANCELLED
        assert (await rig.status()).slots_in_use == 0
        assert await rig.talker_cancelled()


async def test_a_talker_that_dies_fails_the_session_with_unavailable(model: MimiModel) -> None:
    async with stage(model, FakeTalker(mode="die")) as rig:
        s = Session(rig)
        s.send(open=rig.open_msg())
        await s.recv()
        eos = (await s.until(lambda m: m.HasField("end_of_stream"))).end_of_stream
        await s.finish()
        assert (eos.reason, eos.error.code, eos.error.origin) == (
            S.END_REASON_ERROR,
            CODE["UNAVAILABLE"],
            "codec",
        )
        assert "without end_of_stream" in eos.error.message
        assert (await rig.status()).slots_in_use == 0


async def test_a_voice_recording_reaches_the_talker_as_reference_codes(model: MimiModel) -> None:
    async with stage(model, FakeTalker()) as rig:
        rate = 16000
        t = np.arange(2 * rate) / rate
        clip = (0.2 * np.sin(2 * np.pi * 180 * t) + 0.1 * np.sin(2 * np.pi * 410 * t)).astype(np.float32)
        ref = S.VoiceReference(
            audio=S.Payload(inline=(clip * 32767).astype("<i2").tobytes()),
            audio_format=S.PCM_FORMAT_S16LE,
            audio_sample_rate_hz=rate,
        )
        s = Session(rig)
        s.send(open=rig.open_msg(reference=ref, voice=""))
        assert (await s.recv()).HasField("opened")  # type: ignore[union-attr]
        s.send(end_of_input=S.EndOfInput())
        await s.until(lambda m: m.HasField("end_of_stream"))
        await s.finish()
        codes = rig.talker.opens[0].reference.codes
        assert (codes.frame_count, codes.num_groups) == (25, 8)
        got = np.frombuffer(codes.codes.inline, "<i2").reshape(25, 8)
        pcm16 = np.frombuffer(ref.audio.inline, "<i2").astype(np.float32) / 32768.0
        with torch.inference_mode():
            want = model.encode(torch.from_numpy(prepare_reference(pcm16, rate))[None])[0].numpy().T
        np.testing.assert_array_equal(got, want)
