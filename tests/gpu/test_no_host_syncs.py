"""The talkers' per-request host work makes no host-synchronizing copies on CUDA: a copy from pageable
memory or a host scalar written into a device tensor waits for everything queued, which is the frame step in
flight (the H200 profile of a 64-session PersonaPlex join counted 130 of them; docs/benchmarks.md). Each test
runs the path under ``torch.cuda.set_sync_debug_mode("error")``, which raises on such a synchronization.
Skipped without a GPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from services.talker.models import load_talker
from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from services.talker.spec import SpeechSpec
from tests.golden_personaplex import fixture_model, load_case
from tests.unit.talker.test_personaplex_adapter import _sessions
from voxstage.presets import resolve_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture
def no_syncs() -> Iterator[Callable[[Callable[[], object]], object]]:
    def run(fn: Callable[[], object]) -> object:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")

    yield run


def test_a_personaplex_join_burst_makes_no_synchronizing_copy(no_syncs: Callable) -> None:
    """Admission, one batched prefill of several sessions and their first step's setup, as a join burst
    runs them (``DuplexEngine._prefill``), then the next tick's user frames."""
    model = fixture_model(load_case("prompt_voice"), device="cuda")
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(4, model.config.context)
    sessions = _sessions(model)
    n = min(s.prompt.length for s in sessions) - 1

    def join() -> None:
        for slot, s in enumerate(sessions):
            adapter.admit(slot, seed=s.seed, text=s.sampling[0], audio=s.sampling[1])
        adapter.prefill_many([(slot, s.prompt, 0, n) for slot, s in enumerate(sessions)])
        for slot, s in enumerate(sessions):
            adapter.start_decode(slot, s.prompt)
        adapter.set_user(list(range(len(sessions))), np.stack([s.users[0] for s in sessions]))

    no_syncs(join)
    torch.cuda.synchronize()
    assert int(adapter.state.steps[0]) == sessions[0].prompt.length - 1


@pytest.mark.parametrize("variant", ["custom_voice", "clone"])
def test_a_qwen3_prompt_is_built_without_synchronizing(variant: str, no_syncs: Callable) -> None:
    """``prepare`` runs on the engine thread while a frame step is in flight (async scheduling)."""
    preset = "qwen3-tts-tiny" if variant == "custom_voice" else "qwen3-tts-tiny-base"
    adapter, _ = load_talker(resolve_model(preset), device="cuda", dtype=torch.float32)
    model = adapter.model
    if variant == "custom_voice":
        spec = SpeechSpec(text="Hello there.", voice=sorted(model.config.talker.spk_id)[0])
    else:
        rng = np.random.default_rng(0)
        xvec = rng.standard_normal(model.hidden_size).astype(np.float32)
        codes = rng.integers(0, 64, (12, model.num_code_groups), dtype=np.int64)
        spec = SpeechSpec(
            text="Hello there.", speaker_embedding=xvec, ref_text="A reference.", ref_codes=codes
        )
    for _ in range(2):  # the clone's second prompt takes its reference rows from VoiceRows
        prepared = no_syncs(lambda: adapter.prepare(spec))
        assert prepared.prompt is not None  # type: ignore[attr-defined]


def test_a_codec_stream_opens_without_synchronizing(no_syncs: Callable) -> None:
    """A text-to-speech stream's open on the codec engine, fresh and from a voice's stored decoder state: the
    engine thread opens streams between ticks while a decode is in flight (async scheduling)."""
    from services.codec.engine import ChunkSchedule, CodecEngine
    from services.codec.models.qwen3_tts.loader import random_init as random_decoder
    from services.codec.models.qwen3_tts.presets import decoder_preset
    from services.codec.models.qwen3_tts.streaming import StreamingDecoder
    from services.codec.voice_states import VoiceStateCache

    model = random_decoder(decoder_preset("qwen3-tts-tiny"), 0, device="cuda", dtype=torch.float32)
    engine = CodecEngine(StreamingDecoder(model, 4), max_streams=2, schedule=ChunkSchedule(1, 5),
                         num_groups=16, device="cuda", voice_states=VoiceStateCache(1 << 26, 4))  # fmt: skip
    prefix = np.random.default_rng(0).integers(0, 2048, (6, 16), dtype=np.int64)
    engine.open("first", prefix=prefix, prefix_key="voice_x@1")
    engine.finish("first")
    while engine.has_work():
        engine.step()  # decodes the prefix and stores the voice's state
    assert len(engine.voice_states) == 1  # type: ignore[arg-type]
    no_syncs(lambda: engine.open("fresh"))
    no_syncs(lambda: engine.open("voice", prefix=prefix, prefix_key="voice_x@1"))


def test_a_ticks_gathered_admission_writes_make_no_synchronizing_copy(no_syncs: Callable) -> None:
    """``SlotWrites.flush`` (a Qwen3 talker tick's admissions, services/talker/slot_writes.py) uploads its
    places and values through pinned memory, and leaves what the one-at-a-time writes leave."""
    from services.talker.slot_writes import IMMEDIATE, SlotWrites
    from tests.unit.talker.test_slot_writes import apply, tensors

    one_by_one = {k: v.cuda() for k, v in tensors().items()}
    gathered = {k: v.cuda() for k, v in tensors().items()}
    apply(IMMEDIATE, one_by_one)
    writes = SlotWrites()
    apply(writes, gathered)
    no_syncs(writes.flush)
    torch.cuda.synchronize()
    for k in one_by_one:
        assert torch.equal(gathered[k], one_by_one[k]), k


def test_an_audio8_prefill_makes_no_synchronizing_copy(no_syncs: Callable) -> None:
    """Audio8's prefill puts each chunk's ids and codes on the device through pinned memory: the engine
    thread prefills a tick's arrivals while the previous frame step is in flight (async scheduling)."""
    adapter, _ = load_talker(resolve_model("audio8-tts-tiny"), device="cuda", dtype=torch.float32)
    adapter.allocate(4, 256)
    prepared = [adapter.prepare(SpeechSpec(text=f"hello number {i}")) for i in range(3)]
    chunks = [(slot, p, 0, p.length - 1) for slot, p in enumerate(prepared)]
    no_syncs(lambda: adapter.prefill_many(chunks))
    torch.cuda.synchronize()
    assert [int(adapter.state.positions[slot]) for slot in range(3)] == [p.length - 1 for p in prepared]


def test_a_codec_tick_launches_without_synchronizing(no_syncs: Callable) -> None:
    """With async scheduling a text-to-speech codec tick is launched before the previous one is collected:
    the launch's codes, slots and lengths go to the device through pinned memory, so the engine thread does
    not wait for the decode in flight (it did, through pageable copies)."""
    from services.codec.engine import ChunkSchedule, CodecEngine
    from services.codec.models.qwen3_tts.loader import random_init as random_decoder
    from services.codec.models.qwen3_tts.presets import decoder_preset
    from services.codec.models.qwen3_tts.streaming import StreamingDecoder

    model = random_decoder(decoder_preset("qwen3-tts-tiny"), 0, device="cuda", dtype=torch.float32)
    engine = CodecEngine(StreamingDecoder(model, 4), max_streams=2, schedule=ChunkSchedule(1, 5),
                         num_groups=16, device="cuda", async_scheduling=True)  # fmt: skip
    codes = np.random.default_rng(0).integers(0, 2048, (3, 16), dtype=np.int64)
    for key in ("a", "b"):
        engine.open(key)
        engine.push(key, codes[:1])
    assert no_syncs(engine.step) == []  # launched, collected by the next step
    torch.cuda.synchronize()
    outputs = engine.step()
    assert sorted(o.stream_id for o in outputs) == ["a", "b"] and all(o.frames == 1 for o in outputs)
