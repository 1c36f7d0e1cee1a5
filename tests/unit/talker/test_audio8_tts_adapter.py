"""Audio8-TTS through the real talker engine: the adapter's ``decode_core`` (the graphed unit) makes every
frame here. Frames are 10 codes in range, EOS and ``max_seq_len`` stop a request, a request's frames are
the same alone or batched (slots joining, leaving and moving), and seeded sampling is deterministic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.talker.engine import EngineConfig, Finish, TalkerEngine, TalkerOutput, TalkerRequest
from services.talker.models.audio8_tts.adapter import Audio8TTSAdapter
from services.talker.models.audio8_tts.config import parse_config
from services.talker.models.audio8_tts.loader import random_init
from services.talker.models.audio8_tts.model import Audio8TTSModel
from services.talker.models.audio8_tts.presets import preset_config
from services.talker.models.audio8_tts.tokenizer import Audio8Tokenizer
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from tests.unit.talker.talker_kit import drive, frames_of

torch.set_num_threads(1)
SAMPLED = SamplingParams(temperature=0.7, top_k=50, top_p=0.9)
TEXTS = ["hello there", "the quick brown fox", "a", "what time is it?", "please say the number one"]


@pytest.fixture(scope="module")
def tok() -> Audio8Tokenizer:
    return Audio8Tokenizer.tiny()


@pytest.fixture(scope="module")
def model() -> Audio8TTSModel:
    return random_init(parse_config(preset_config("audio8-tts-tiny")), seed=0)


@pytest.fixture(scope="module")
def eos_model() -> Audio8TTSModel:
    """Always prefers <|im_end|>: with every block's output projections zeroed the final hidden state is the
    normalised input embedding, whose channel 0 is made positive, and the eos row is large there."""
    m = random_init(parse_config(preset_config("audio8-tts-tiny")), seed=0)
    with torch.no_grad():
        for layer in m.layers:
            layer.attention.wo.weight.zero_()
            layer.feed_forward.w2.weight.zero_()
        m.embeddings.weight[:, 0] = 1.0
        m.codebook_embeddings.weight[:, 0] = 0.0
        m.embeddings.weight[m.config.eos_token_id, 0] = 100.0
    return m


def make_engine(model: Audio8TTSModel, tok: Audio8Tokenizer, slots: int, **kw: object) -> TalkerEngine:
    cfg: dict = dict(max_num_seqs=slots, max_model_len=256, max_num_batched_tokens=16)
    cfg.update(kw)
    return TalkerEngine(Audio8TTSAdapter(model, tok), EngineConfig(**cfg))


def request(i: int, frames: int = 6, seed: int | None = None, **spec: object) -> TalkerRequest:
    text = str(spec.pop("text", f"{TEXTS[i % len(TEXTS)]} {i}"))
    s = SpeechSpec(text=text, **spec)  # type: ignore[arg-type]
    return TalkerRequest(f"r{i}", s, 1000 + i if seed is None else seed, SAMPLED, SAMPLED, max_frames=frames)


def test_frames_are_ten_codes_in_range(model: Audio8TTSModel, tok: Audio8Tokenizer) -> None:
    out = drive(make_engine(model, tok, 2), [request(0, frames=12), request(1, frames=5)])
    for rid, n in (("r0", 12), ("r1", 5)):
        codes = frames_of(out[rid])
        assert codes.shape == (n, 10) and codes.dtype == np.int64
        assert codes.min() >= 0 and codes.max() < 4096
        assert out[rid][-1].finish is Finish.MAX_FRAMES
    assert len(np.unique(frames_of(out["r0"]), axis=0)) > 1


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_batched_requests_equal_their_alone_runs(
    model: Audio8TTSModel, tok: Audio8Tokenizer, async_scheduling: bool
) -> None:
    """Ten requests over 4 slots: they queue, join between ticks, leave (slots compacted by move_slot)."""
    reqs = [request(i, frames=4 + i % 5) for i in range(10)]
    reqs[3] = request(3, frames=7, text="<|speaker:2|>Tagged speaker.")
    batched = drive(make_engine(model, tok, 4, async_scheduling=async_scheduling), reqs, stagger=2)
    for r in reqs:
        alone = drive(make_engine(model, tok, 1), [r])
        assert np.array_equal(frames_of(alone[r.request_id]), frames_of(batched[r.request_id])), r.request_id


def test_seeded_sampling_is_deterministic(model: Audio8TTSModel, tok: Audio8Tokenizer) -> None:
    a = drive(make_engine(model, tok, 2), [request(0, frames=8, seed=7)])["r0"]
    b = drive(make_engine(model, tok, 3), [request(0, frames=8, seed=7)])["r0"]
    c = drive(make_engine(model, tok, 2), [request(0, frames=8, seed=8)])["r0"]
    assert np.array_equal(frames_of(a), frames_of(b))
    assert not np.array_equal(frames_of(a), frames_of(c))


def test_cancel_moves_the_last_slot_and_survivors_stay_exact(
    model: Audio8TTSModel, tok: Audio8Tokenizer
) -> None:
    eng = make_engine(model, tok, 3)
    reqs = [request(i, frames=12) for i in range(3)]
    out: dict[str, list[TalkerOutput]] = {}
    for r in reqs:
        eng.submit(r)
    for tick in range(200):
        if tick == 5:
            assert eng.slot_of("r2") == 2
            eng.cancel("r0")  # slot 0 frees; r2's KV, pending input and RAS window move into it
        for o in eng.step():
            out.setdefault(o.request_id, []).append(o)
        if tick == 5:
            assert eng.slot_of("r2") == 0
        if not eng.has_work():
            break
    assert out["r0"][-1].finish is Finish.CANCELLED
    for r in reqs[1:]:
        alone = drive(make_engine(model, tok, 1), [r])
        assert np.array_equal(frames_of(alone[r.request_id]), frames_of(out[r.request_id])), r.request_id


def test_eos_stops_after_min_frames(eos_model: Audio8TTSModel, tok: Audio8Tokenizer) -> None:
    r = request(0, frames=50)
    r.min_frames = 3
    outs = drive(make_engine(eos_model, tok, 2), [r])["r0"]
    assert frames_of(outs).shape == (3, 10) and outs[-1].finish is Finish.EOS


def test_max_seq_len_ends_with_eos(model: Audio8TTSModel, tok: Audio8Tokenizer) -> None:
    """Prompt + frames fill max_seq_len: the step at the last position reports EOS instead of a frame."""
    small = random_init(parse_config({**preset_config("audio8-tts-tiny"), "max_seq_len": 48}), seed=0)
    eng = make_engine(small, tok, 1, max_model_len=48)
    r = request(0, frames=1000)
    prompt_len = eng.adapter.prepare(r.spec).length  # type: ignore[attr-defined]
    r.min_frames = 48 - prompt_len  # EOS banned for every frame that fits: only the limit can stop it
    outs = drive(eng, [r])["r0"]
    assert frames_of(outs).shape == (48 - prompt_len, 10) and outs[-1].finish is Finish.EOS


def test_streamed_text_is_ready_only_when_complete(model: Audio8TTSModel, tok: Audio8Tokenizer) -> None:
    whole = drive(make_engine(model, tok, 1), [request(0, text="hello there, how are you?")])["r0"]
    eng = make_engine(model, tok, 1)
    eng.submit(request(0, text="hello there,", text_complete=False))
    for _ in range(3):
        assert not eng.step() and eng.request_state("r0") == "waiting"
    eng.push_text("r0", " how are", complete=False)
    assert not eng.step() and eng.request_state("r0") == "waiting"
    eng.push_text("r0", " you?", complete=True)
    assert np.array_equal(frames_of(drive(eng, [])["r0"]), frames_of(whole))


def test_voices_and_voice_clone_prompts(model: Audio8TTSModel, tok: Audio8Tokenizer) -> None:
    adapter = Audio8TTSAdapter(model, tok)
    adapter.allocate(1, 256)
    plain = adapter.prepare(SpeechSpec(text="hello there"))
    tagged = adapter.prepare(SpeechSpec(text="<|speaker:3|>hello there", voice="Default"))
    assert plain.prompt is not None and tagged.prompt is not None
    assert tagged.length == plain.length + 1 and tok.speaker_id(3) in tagged.prompt.ids
    for voice in ("ryan", "speaker_3"):
        with pytest.raises(ValueError, match="voice"):
            adapter.prepare(SpeechSpec(text="hi", voice=voice))
    with pytest.raises(ValueError, match="x_vector"):
        adapter.prepare(SpeechSpec(text="hi", speaker_embedding=np.zeros(4, np.float32)))
    with pytest.raises(ValueError, match="instructions"):
        adapter.prepare(SpeechSpec(text="hi", instructions="whisper"))
    ref = np.random.default_rng(0).integers(0, 1024, (12, 10))
    clone = adapter.prepare(SpeechSpec(text="hello there", ref_text="the quick brown fox", ref_codes=ref))
    assert clone.prompt is not None and clone.prompt.ref_frames == 12
    out = drive(make_engine(model, tok, 1), [request(0, text="hello", ref_text="the fox", ref_codes=ref)])
    assert frames_of(out["r0"]).shape == (6, 10)


def test_graph_keys_cover_every_bucket(model: Audio8TTSModel, tok: Audio8Tokenizer) -> None:
    adapter = Audio8TTSAdapter(model, tok)
    adapter.allocate(6, 256)
    decode, prefill = adapter.graph_keys()
    assert [b for b, _ in decode[:: len(decode) // 3]] == [1, 2, 4]
    assert {c for _, c in decode} == {64, 128, 256} and prefill
    assert adapter.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 4  # layers x K/V x kv heads x head_dim x fp32
    assert adapter.capture_all_graphs() == 0  # graphs not enabled (CPU)
