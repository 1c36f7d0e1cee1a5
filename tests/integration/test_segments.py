"""Segments through the real stack (talker, codec and gateway as compose runs them, tiny Qwen3-TTS on CPU):
every flush is its own take with its own ``segment_done``; a stream kept open after a flush gets its audio
and waits for more text without a timeout; the text-derived frame cap ends a runaway take; and an LLM-rate
client (about 200 tokens as deltas at 30 tokens/s, a flush per sentence) hears its first audio before the
text is complete and every sentence as its own segment, in order, without gaps between them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest

from tests.integration.deploykit import ComposeStack
from voxstage.segments import FrameCap
from voxstage.v1 import speech_pb2, speech_pb2_grpc

SPF = 1920  # samples per 12.5 Hz frame at 24 kHz
RATE = 24_000
Req = speech_pb2.StreamingSynthesizeRequest


@pytest.fixture(scope="module")
def stack(compose_stack: ComposeStack) -> ComposeStack:
    return compose_stack  # the session's compose stack (tests/integration/conftest.py), shared


@dataclass
class Heard:
    """Everything a streaming client received, with arrival times (monotonic, from the call's start)."""

    t0: float = field(default_factory=time.monotonic)
    audio: list[tuple[float, speech_pb2.AudioChunk]] = field(default_factory=list)
    done: list[tuple[float, speech_pb2.SegmentDone]] = field(default_factory=list)
    summary: speech_pb2.SynthesisSummary | None = None

    def samples(self, segment: int | None = None) -> int:
        return sum(len(a.data) // 2 for _, a in self.audio if segment is None or a.segment_index == segment)


def config(max_frames: int | None = None) -> speech_pb2.SynthesisConfig:
    cfg = speech_pb2.SynthesisConfig(encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE, voice="ryan")
    if max_frames is not None:
        cfg.sampling.max_frames = max_frames
    return cfg


async def converse(addr: str, inputs: AsyncIterator[Req], heard: Heard, *, deadline_s: float = 60.0) -> Heard:
    async with grpc.aio.insecure_channel(addr) as channel:
        call = speech_pb2_grpc.SpeechStub(channel).StreamingSynthesize(inputs, timeout=deadline_s)
        async for reply in call:
            now = time.monotonic() - heard.t0
            kind = reply.WhichOneof("response")
            if kind == "audio":
                heard.audio.append((now, reply.audio))
            elif kind == "segment_done":
                heard.done.append((now, reply.segment_done))
            elif kind == "summary":
                heard.summary = reply.summary
    return heard


def check_counts(heard: Heard) -> None:
    """The summary's counts are what the client received, segment by segment."""
    s = heard.summary
    assert s is not None
    assert s.segment_count == len(heard.done)
    assert [d.segment_index for _, d in heard.done] == list(range(len(heard.done)))
    assert s.sample_count == heard.samples() == sum(d.sample_count for _, d in heard.done)
    for _, d in heard.done:
        assert heard.samples(d.segment_index) == d.sample_count > 0
    # Audio arrives segment by segment, contiguous in the stream's sample offsets.
    indexes = [a.segment_index for _, a in heard.audio]
    assert indexes == sorted(indexes)
    offsets = [a.sample_offset for _, a in heard.audio]
    sizes = [len(a.data) // 2 for _, a in heard.audio]
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]


async def test_each_flush_is_its_own_segment_with_max_frames_each(stack: ComposeStack) -> None:
    async def inputs() -> AsyncIterator[Req]:
        yield Req(config=config(max_frames=5))
        for text in ("First one.", "Second one.", "Third."):
            yield Req(text=text)
            yield Req(flush=speech_pb2.Flush())

    heard = await converse(stack.grpc_addr, inputs(), Heard())
    check_counts(heard)
    assert len(heard.done) == 3
    # max_frames applies per segment: none is dropped, and each ran to its budget (the tiny model rarely
    # says end-of-speech) or ended on its own.
    for _, d in heard.done:
        assert 0 < d.sample_count <= 5 * SPF
    assert heard.summary is not None and heard.summary.frame_count <= 15


async def test_a_stream_kept_open_gets_its_audio_then_waits_for_more_text(stack: ComposeStack) -> None:
    # "Hello there." + flush on a stream kept open used to stall into DEADLINE_EXCEEDED after 3 chunks, and
    # "hi" + flush gave no audio at all: a flushed segment is spoken whole, whatever comes next.
    more = asyncio.Event()

    async def inputs() -> AsyncIterator[Req]:
        yield Req(config=config(max_frames=4))
        yield Req(text="Hello there.")
        yield Req(flush=speech_pb2.Flush())
        await more.wait()  # hold the stream open, silent, until the first segment is done
        await asyncio.sleep(1.0)  # and a while longer: nothing is owed now, so no timeout may run
        yield Req(text="hi")
        yield Req(flush=speech_pb2.Flush())

    heard = Heard()
    task = asyncio.create_task(converse(stack.grpc_addr, inputs(), heard))
    for _ in range(300):
        if heard.done:
            break
        await asyncio.sleep(0.05)
    assert heard.done and heard.samples(0) == heard.done[0][1].sample_count > 0
    more.set()
    await asyncio.wait_for(task, 30)
    check_counts(heard)
    assert len(heard.done) == 2 and heard.samples(1) > 0


async def test_the_frame_cap_ends_a_runaway_take(stack: ComposeStack) -> None:
    text = "Hi."

    async def inputs() -> AsyncIterator[Req]:
        yield Req(config=config())  # no max_frames: the text-derived cap is the budget
        yield Req(text=text)

    heard = await converse(stack.grpc_addr, inputs(), Heard())
    check_counts(heard)
    cap = FrameCap().frames(text, 12.5)  # the deploy file keeps the default rates
    s = heard.summary
    assert s is not None
    if s.finish_reason == speech_pb2.FINISH_REASON_FRAME_CAP:
        assert s.frame_count == cap and heard.done[0][1].finish_reason == speech_pb2.FINISH_REASON_FRAME_CAP
    else:  # the random model happened to stop on its own before the cap
        assert s.finish_reason == speech_pb2.FINISH_REASON_END_OF_SPEECH and s.frame_count < cap


LLM_TEXT = (
    "Streaming speech starts before the answer is finished. "
    "Each sentence becomes its own segment as soon as it ends. "
    "The talker keeps its place while the codec plays the last one. "
    "Short sentences work too. "
    "So do longer ones that wander on for a while before they finally come to a stop. "
    "Numbers like 3.5 do not end a sentence. "
    "Neither does a comma, of course. "
    "The client hears every part in order. "
    "Nothing is lost between the parts. "
    "That is the whole point of it. "
    "Lists of items arrive one after another, each spoken in turn. "
    "Finally, the stream closes once the answer is complete."
)


def llm_tokens(text: str) -> list[str]:
    """Roughly LLM-sized deltas: words with their leading space cut into pieces of at most 4 characters,
    punctuation on its own (about 1.3 tokens per English word, as BPE vocabularies give)."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        core, punct = word.rstrip(".,"), word[len(word.rstrip(".,")) :]
        core = ("" if i == 0 else " ") + core
        out += [core[k : k + 4] for k in range(0, len(core), 4)]
        out += list(punct)
    return out


async def test_llm_rate_deltas_start_early_and_every_sentence_is_a_gapless_segment(
    stack: ComposeStack,
) -> None:
    tokens = llm_tokens(LLM_TEXT)
    assert 150 <= len(tokens) <= 250
    sentences = LLM_TEXT.count(". ") + 1
    text_done = asyncio.Event()
    heard = Heard()

    async def inputs() -> AsyncIterator[Req]:
        yield Req(config=config(max_frames=16))  # 1.3 s of audio per sentence, longer than its text takes
        for token in tokens:
            yield Req(text=token)
            if token == ".":
                yield Req(flush=speech_pb2.Flush())
            await asyncio.sleep(1 / 30)
        text_done.set()
        heard.text_done_at = time.monotonic() - heard.t0  # type: ignore[attr-defined]

    await converse(stack.grpc_addr, inputs(), heard, deadline_s=120)
    check_counts(heard)
    assert len(heard.done) == sentences
    first_audio = heard.audio[0][0]
    assert first_audio < heard.text_done_at  # type: ignore[attr-defined]
    # Playback from the first chunk: each later chunk must arrive before the audio already received has
    # played out. Allowed: the schedule's own first chunks (this checks segment seams and the rest) plus
    # scheduling jitter on a shared 2-core CI box.
    played_until = first_audio
    seam_late = []
    for t, a in heard.audio:
        late = t - played_until
        if late > 0 and a.segment_index > 0 and a.sample_offset == _first_offset(heard, a.segment_index):
            seam_late.append(late)
        played_until = max(played_until, t) + len(a.data) / 2 / RATE
    assert max(seam_late, default=0.0) < 0.25, seam_late


def _first_offset(heard: Heard, segment: int) -> int:
    return next(a.sample_offset for _, a in heard.audio if a.segment_index == segment)
