"""Talker engine in-process: batch invariance, batching, cancellation, prefix cache, streamed text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.talker.engine import (
    AdmissionError,
    EngineConfig,
    Finish,
    RequestTooLarge,
    TalkerEngine,
    TalkerOutput,
    TalkerRequest,
)
from services.talker.models.qwen3_tts.adapter import Qwen3TTSAdapter
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.tokenizer import QwenTextTokenizer
from services.talker.sampling import Sampler, SamplingParams
from services.talker.spec import SpeechSpec
from tests.unit.talker.talker_kit import drive, frames_of

SAMPLED = SamplingParams(do_sample=True, temperature=0.9, top_k=50, repetition_penalty=1.05)
GREEDY = SamplingParams(do_sample=False)
TEXTS = ["hello there", "the quick brown fox", "a", "we will see the world at noon", "tell me more"]


def make_engine(model: Qwen3TTSTalker, tok: QwenTextTokenizer, slots: int, **kw: object) -> TalkerEngine:
    cfg = dict(max_num_seqs=slots, max_model_len=192, max_num_batched_tokens=16)
    cfg.update(kw)
    return TalkerEngine(Qwen3TTSAdapter(model, tok), EngineConfig(**cfg))  # type: ignore[arg-type]


def request(i: int, sampling: SamplingParams = SAMPLED, frames: int = 8, **spec: object) -> TalkerRequest:
    text = str(spec.pop("text", f"{TEXTS[i % len(TEXTS)]} {i}"))
    voice = str(spec.pop("voice", "ryan"))
    s = SpeechSpec(text=text, voice=voice, language="english", **spec)  # type: ignore[arg-type]
    return TalkerRequest(f"r{i}", s, seed=1000 + i, sampling=sampling, subtalker=sampling, max_frames=frames)


def assert_same_frames(
    a: dict[str, list[TalkerOutput]], b: dict[str, list[TalkerOutput]], reqs: list[TalkerRequest]
) -> None:
    for r in reqs:
        assert np.array_equal(frames_of(a[r.request_id]), frames_of(b[r.request_id])), r.request_id


@pytest.mark.parametrize(
    "sampling,async_scheduling",
    [(SAMPLED, False), (GREEDY, False), (SAMPLED, True)],
    ids=["sampled", "greedy", "sampled-async"],
)
def test_sixteen_staggered_requests_equal_their_alone_runs(
    tiny_custom_voice: Qwen3TTSTalker,
    tiny_tokenizer: QwenTextTokenizer,
    sampling: SamplingParams,
    async_scheduling: bool,
) -> None:
    torch.manual_seed(0)
    reqs = [request(i, sampling) for i in range(16)]
    # 6 slots for 16 requests: requests queue, join as others leave, and slots get compacted.
    engine = make_engine(tiny_custom_voice, tiny_tokenizer, 6, async_scheduling=async_scheduling)
    batched = drive(engine, reqs, stagger=2)
    for r in reqs:
        alone = drive(make_engine(tiny_custom_voice, tiny_tokenizer, 1), [r])
        a, b = frames_of(alone[r.request_id]), frames_of(batched[r.request_id])
        assert a.shape == b.shape and a.shape[0] >= 2
        assert np.array_equal(a, b), f"{r.request_id} differs batched vs alone"
        assert batched[r.request_id][-1].finish in (Finish.EOS, Finish.MAX_FRAMES)


def test_different_seeds_differ_and_outputs_are_ordered(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    r1 = request(0)
    r2 = TalkerRequest("other", r1.spec, seed=7, sampling=SAMPLED, subtalker=SAMPLED, max_frames=12)
    out = drive(make_engine(tiny_custom_voice, tiny_tokenizer, 2), [r1, r2])
    assert not np.array_equal(frames_of(out["r0"]), frames_of(out["other"]))
    firsts = [o.first_frame for o in out["r0"] if o.codes.shape[0]]
    assert firsts == list(range(len(firsts)))


def test_cancel_frees_slot_next_tick(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 2)
    eng.submit(request(0, frames=40))
    eng.submit(request(1, frames=40))
    for _ in range(5):
        eng.step()
    assert eng.slots_in_use() == 2 and eng.request_state("r1") == "decode"
    eng.cancel("r1")
    outs = eng.step()
    assert [o.finish for o in outs if o.request_id == "r1"] == [Finish.CANCELLED]
    assert eng.slots_in_use() == 1 and eng.request_state("r1") == "absent"
    assert not eng.cancel("r1")  # unknown now


def test_cancelled_slot_compaction_keeps_survivor_exact(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 3)
    reqs = [request(i, frames=20) for i in range(3)]
    out: dict[str, list[TalkerOutput]] = {}
    for r in reqs:
        eng.submit(r)
    for tick in range(200):
        if tick == 6:
            eng.cancel("r0")  # slot 0 frees; the last slot moves into it mid-generation
        for o in eng.step():
            out.setdefault(o.request_id, []).append(o)
        if not eng.has_work():
            break
    assert out["r0"][-1].finish is Finish.CANCELLED
    for r in reqs[1:]:
        alone = drive(make_engine(tiny_custom_voice, tiny_tokenizer, 1), [r])
        assert np.array_equal(frames_of(alone[r.request_id]), frames_of(out[r.request_id]))


def test_prefix_cache_hit_equals_miss(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    instruct = "speak slowly and warmly, like a storyteller by the fire"
    reqs = [request(i, instructions=instruct, voice="vivian") for i in range(3)]
    cached = make_engine(tiny_custom_voice, tiny_tokenizer, 1, enable_prefix_caching=True)
    hit = drive(cached, reqs)
    assert cached.prefix_hits == 2 and cached.prefill_tokens_saved > 2 * 10
    miss = drive(make_engine(tiny_custom_voice, tiny_tokenizer, 1), reqs)
    assert_same_frames(hit, miss, reqs)


def test_streamed_text_waits_instead_of_padding(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    whole = request(0, text="hello there the world", non_streaming=False)
    ref = drive(make_engine(tiny_custom_voice, tiny_tokenizer, 1), [whole])["r0"]

    streamed = request(0, text="hel", text_complete=False, non_streaming=False)
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 1)
    eng.submit(streamed)
    outs: list[TalkerOutput] = []
    for _ in range(3):  # the first word is incomplete: nothing can be prefilled yet
        outs += eng.step()
    assert eng.request_state("r0") == "waiting" and not outs
    eng.push_text("r0", "lo there", complete=False)
    for _ in range(6):  # " there" is held back (may grow), so the slot starves after one frame
        outs += eng.step()
    produced = sum(o.codes.shape[0] for o in outs)
    assert 1 <= produced <= 2
    eng.push_text("r0", " the world", complete=True)
    outs += drive(eng, [])["r0"]
    assert np.array_equal(frames_of(outs), frames_of(ref))


def test_rejections(tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer) -> None:
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 1, max_model_len=24, max_queue=1)
    with pytest.raises(RequestTooLarge, match="max_model_len"):
        eng.submit(request(0, text="this sentence is far too long for a twenty four position window"))
    eng.submit(request(1, text="hi"))
    with pytest.raises(AdmissionError, match="queue is full"):
        eng.submit(request(2, text="hi"))
    with pytest.raises(ValueError, match="speaker"):
        eng.submit(request(3, text="hi", voice="nobody"))


def test_streamed_text_past_the_window_ends_only_its_request(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    """Issue 26: streamed text longer than a slot's text queue crashed the engine thread (exit 3) and
    every request on it. Now the push is refused with RequestTooLarge, the request alone ends, and the
    neighbour's frames equal its run alone."""
    solo = make_engine(tiny_custom_voice, tiny_tokenizer, 2, max_model_len=64)
    alone = drive(solo, [request(1, frames=12)])
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 2, max_model_len=64)
    streamed = request(0, text="hello there", text_complete=False, non_streaming=False, frames=60)
    eng.submit(streamed)
    eng.submit(request(1, frames=12))
    outs: list[TalkerOutput] = []
    for _ in range(3):
        outs += eng.step()
    assert eng.request_state("r0") in ("prefill", "decode")
    with pytest.raises(RequestTooLarge, match="text: .* tokens"):
        eng.push_text("r0", " 字" * 100, complete=False)
    rest = drive(eng, [])
    mine = [o for o in outs if o.request_id == "r0"] + rest["r0"]
    assert mine[-1].finish is Finish.CANCELLED and eng.request_state("r0") == "absent"
    neighbour = [o for o in outs if o.request_id == "r1"] + rest["r1"]
    assert np.array_equal(frames_of(neighbour), frames_of(alone["r1"]))
    # a waiting request whose text cannot fit is refused at submit
    with pytest.raises(RequestTooLarge, match="max_model_len 64"):
        eng.submit(request(2, text="字" * 200, non_streaming=False))


def test_max_model_len_stops_with_reason(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 1, max_model_len=40)
    out = drive(eng, [request(0, GREEDY, frames=500, text="hi")])["r0"]
    assert out[-1].finish in (Finish.MAX_MODEL_LEN, Finish.EOS)
    if out[-1].finish is Finish.MAX_MODEL_LEN:
        assert frames_of(out).shape[0] + 1 <= 40


def test_padded_prefill_equals_exact_length_prefill(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    # The graphed prefill pads each chunk to a power of two (padding K/V lands at the slot's future
    # positions). Checked here on the eager path: chunks of 13 tokens (the budget) padded to 16, with 3
    # slots interleaving prefill and decode.
    reqs = [request(i, frames=10) for i in range(5)]
    outs = []
    for padded in (False, True):
        engine = make_engine(
            tiny_custom_voice, tiny_tokenizer, 3, max_num_batched_tokens=13, max_model_len=48
        )
        engine.adapter.prefill_runner.padded = padded  # type: ignore[attr-defined]
        outs.append(drive(engine, reqs, stagger=1))
    assert_same_frames(outs[0], outs[1], reqs)


def test_out_of_range_codes_end_only_their_request(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    engine = make_engine(tiny_custom_voice, tiny_tokenizer, 2)
    adapter = engine.adapter
    collect = adapter.collect
    calls = 0

    def corrupt(handle: object) -> tuple[np.ndarray, np.ndarray]:
        nonlocal calls
        codes, eos = collect(handle)
        calls += 1
        if calls == 3:  # a stand-in for a device-side fault in row 0
            codes[0, 5] = adapter.codebook_size  # type: ignore[attr-defined]
        return codes, eos

    adapter.collect = corrupt  # type: ignore[method-assign]
    out = drive(engine, [request(0, frames=6), request(1, frames=6)], stagger=1)
    bad, good = out["r0"][-1], out["r1"][-1]
    assert bad.finish is Finish.ERROR and "outside [0, 2048)" in (bad.error or "")
    assert frames_of(out["r0"]).max() < 2048  # the bad frame is never emitted
    assert good.finish is Finish.MAX_FRAMES and frames_of(out["r1"]).shape == (6, 16)


def test_startup_capture_covers_every_key_the_engine_can_use(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    from services.talker.launch import bucket
    from services.talker.models.qwen3_tts.prefill import PrefillChunk

    adapter = Qwen3TTSAdapter(tiny_custom_voice, tiny_tokenizer)
    adapter.allocate(6, 300)
    decode, prefill = map(set, adapter.graph_keys())
    for n in range(1, 7):
        for attn in range(1, 301):
            for sampler in Sampler:
                assert (bucket(n, 6), bucket(attn, 300, adapter.min_attn_bucket), sampler, 0) in decode
                # A head-only step (rows starting from their prefill's hidden state) reads no context.
                assert (bucket(n, 6), adapter.min_attn_bucket, sampler, 1) in decode
    # (1, 2, 4, 6) x (64, 128, 256, 300) x the sampler variants, and head-only (1, 2, 4, 6) x the samplers
    assert len(decode) == 4 * 4 * 3 + 4 * 3
    # Every padded forward the prefill runs (random ticks of up to 6 chunks) uses a key in the list.
    runner = adapter.prefill_runner
    used: list[tuple[int, int, int]] = []
    runner.core = lambda rows, t, ctx: used.append((rows, t, ctx))  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    hidden = tiny_custom_voice.hidden_size
    for _ in range(300):
        slots = rng.permutation(6)[: rng.integers(1, 7)]
        chunks = []
        for slot in slots:
            n = int(rng.choice([1, 7, 16, 17, 40, 100, 250]))
            start = int(rng.integers(0, 300 - n))
            chunks.append(PrefillChunk(int(slot), torch.zeros(n, hidden), start))
        runner.run(chunks)
    assert used and set(used) <= prefill
    assert any(rows > 1 for rows, _, _ in used)
    assert adapter.capture_all_graphs() == 0  # CPU: nothing is captured


def test_each_step_takes_the_sampler_variant_of_its_active_rows(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    engine = make_engine(tiny_custom_voice, tiny_tokenizer, 3)
    adapter = engine.adapter
    assert isinstance(adapter, Qwen3TTSAdapter)
    used: list[tuple[int, int, int]] = []
    core = adapter.decode_core

    def record(b: int, attn_len: int, sampler: int = Sampler.FULL, head_only: int = 0) -> None:
        used.append((b, attn_len, sampler, head_only))
        core(b, attn_len, sampler, head_only)

    adapter.decode_core = record  # type: ignore[method-assign]
    nucleus = SamplingParams(temperature=0.9, top_k=50, top_p=0.9)
    # A greedy request alone, then a top-k one joins, then a top-p one: each step's variant is the least
    # specialised of the rows it runs.
    drive(engine, [request(0, GREEDY, 12), request(1, SAMPLED, 6), request(2, nucleus, 3)], stagger=4)
    variants = [v for _, _, v, _ in used]
    assert variants[0] == Sampler.GREEDY and {Sampler.TOP_K, Sampler.FULL} <= set(variants)
    assert set(used) <= set(adapter.graph_keys()[0])


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_first_frame_from_its_prefills_hidden_state_equals_a_whole_steps(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer, sampling: SamplingParams
) -> None:
    """The prefill takes a prompt's last position too, and a step whose rows all start there skips the
    backbone (``head_only``): the frames are those of the old way (the last position run by the first
    step), in fp32, for lone requests and for one joining a running one (that step runs whole)."""
    reqs = [request(0, sampling, 10), request(1, sampling, 8), request(2, sampling, 6)]
    outs, steps = [], []
    for fold in (False, True):
        engine = make_engine(tiny_custom_voice, tiny_tokenizer, 3, max_num_batched_tokens=512)
        adapter = engine.adapter
        assert isinstance(adapter, Qwen3TTSAdapter)
        adapter.prefills_last_position = fold
        used: list[int] = []
        core = adapter.decode_core

        def record(b: int, attn_len: int, sampler: int = Sampler.FULL, head_only: int = 0) -> None:
            used.append(head_only)  # noqa: B023 - each pass records into its own list
            core(b, attn_len, sampler, head_only)  # noqa: B023

        adapter.decode_core = record  # type: ignore[method-assign]
        outs.append(drive(engine, reqs, stagger=3))
        steps.append(used)
    assert_same_frames(outs[0], outs[1], reqs)
    assert sum(steps[0]) == 0
    assert steps[1].count(1) >= 1  # the first request's first step, alone
    assert len(steps[1]) == len(steps[0])


def test_one_tick_of_arrivals_prefills_in_one_forward_with_the_same_codes(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    # Five requests admitted in one tick: batched into one padded forward (rows padded 5 -> 8 by repeating
    # row 0) they must produce exactly what one exact-length forward per request produces.
    reqs = [request(i, frames=6) for i in range(5)]
    outs, forwards = [], []
    for padded in (False, True):
        engine = make_engine(tiny_custom_voice, tiny_tokenizer, 5, max_num_batched_tokens=512)
        engine.adapter.prefill_runner.padded = padded  # type: ignore[attr-defined]
        for r in reqs:
            engine.submit(r)
        outs.append(drive(engine, []))
        forwards.append(engine.adapter.prefill_runner.forwards)  # type: ignore[attr-defined]
    assert forwards == [5, 1]
    assert_same_frames(outs[0], outs[1], reqs)


def test_graphs_enabled_before_the_slots_exist_reach_the_prefill(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    # The talker stage enables graphs, then the engine allocates the slots: the prefill must be graphed too.
    adapter = Qwen3TTSAdapter(tiny_custom_voice, tiny_tokenizer)
    adapter.enable_cuda_graphs()
    adapter.allocate(2, 64)
    assert adapter.graphs is not None and adapter.prefill_runner.graphs is not None


def test_a_prefill_forward_runs_on_the_tables_an_earlier_longer_chunk_left(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    """A graph's warm-up and capture run the forward of a (rows, length) key on whatever the static tables
    hold: after a 100-token chunk a 16-token key must still run (its last-position gather stays in the
    chunk), and the real chunk's kept hidden state is its last position's."""
    from services.talker.models.qwen3_tts.prefill import PrefillChunk

    adapter = Qwen3TTSAdapter(tiny_custom_voice, tiny_tokenizer)
    adapter.allocate(2, 256)
    runner = adapter.prefill_runner
    embeds = torch.randn(100, tiny_custom_voice.hidden_size)
    runner.run([PrefillChunk(1, embeds, 0)])
    kept = adapter.first_h[1].clone()
    out = tiny_custom_voice(embeds.unsqueeze(0), torch.arange(100).unsqueeze(0), adapter.kv, None, 128)
    torch.testing.assert_close(kept, out[0, -1].to(kept.dtype))
    runner.core(1, 16, 64)  # as a capture of that key would, with the tables left at 100 tokens


def test_a_follower_takes_the_freed_slot_ahead_of_the_queue(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    # One slot: r0 runs, r1 queues, r2 follows r0 (a stream's next segment). When r0 ends, r2 goes first.
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 1)
    eng.submit(request(0, frames=4))
    eng.submit(request(1, frames=4))
    eng.submit(request(2, frames=4), follows="r0")
    assert eng.queue_depth() == 3  # r0 and r1 waiting, r2 following
    order: list[str] = []
    out: dict[str, list[TalkerOutput]] = {}
    for _ in range(100):
        for o in eng.step():
            out.setdefault(o.request_id, []).append(o)
            if o.finish is not None:
                order.append(o.request_id)
        if not eng.has_work():
            break
    assert order == ["r0", "r2", "r1"]
    # A follower's frames are what it makes alone: taking over a slot leaves nothing of the previous take.
    alone = drive(make_engine(tiny_custom_voice, tiny_tokenizer, 1), [request(2, frames=4)])
    assert np.array_equal(frames_of(alone["r2"]), frames_of(out["r2"]))


def test_cancelling_a_take_cancels_its_follower(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 2)
    eng.submit(request(0, frames=40))
    eng.submit(request(1, frames=40), follows="r0")
    eng.submit(request(2, frames=40), follows="r1")  # a chain: r2 waits behind r1, which waits behind r0
    for _ in range(3):
        eng.step()
    eng.cancel("r0")
    finishes: dict[str, Finish] = {}
    for _ in range(5):
        finishes.update({o.request_id: o.finish for o in eng.step() if o.finish is not None})
    assert finishes == dict.fromkeys(("r0", "r1", "r2"), Finish.CANCELLED)
    assert eng.slots_in_use() == 0 and eng.queue_depth() == 0 and not eng.has_work()


def test_a_follower_of_an_ended_take_goes_to_the_front(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    eng = make_engine(tiny_custom_voice, tiny_tokenizer, 1)
    eng.submit(request(0, frames=40))
    eng.submit(request(1, frames=2))
    eng.step()  # r0 holds the slot, r1 waits
    eng.submit(request(3, frames=2), follows="gone")  # the take it follows has already ended
    order = []
    for _ in range(200):
        order += [o.request_id for o in eng.step() if o.finish is not None]
        if not eng.has_work():
            break
    assert order == ["r0", "r3", "r1"]
