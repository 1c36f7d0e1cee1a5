"""A failure belongs to its request (issue 26), in the talker's engines: an exception raised while the engine
works on one request (admission, its prefill, the start of its decode, the frame step, a duplex session's
prefill) ends that request (``Finish.ERROR``, slot freed, its id from ``recover``); the others go on and
produce exactly the frames they produce alone. Only a device failure stops the engine thread (and with it
the stage): ``voxstage.stage.faults``.

The fault is injected into the real tiny adapters (one method raises for one chosen request); what serves
is the engine and the engine thread as they run in the stage.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from services.talker.duplex.engine import DuplexConfig, DuplexEngine, DuplexRequest
from services.talker.engine import Finish, TalkerEngine, TalkerOutput
from services.talker.models import Catalog, CatalogVoice, TalkerInfo
from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.tokenizer import QwenTextTokenizer
from services.talker.sampling import SamplingParams
from services.talker.worker import TalkerDefaults, TalkerWorker
from tests.engine_faults import step_or_recover
from tests.golden_personaplex import fixture_model, load_case
from tests.unit.talker.talker_kit import drive, frames_of
from tests.unit.talker.test_talker_duplex import AUDIO, TEXT, user_frames
from tests.unit.talker.test_talker_engine import make_engine, request
from voxstage.config import StageConfig
from voxstage.stage.engine_loop import EngineThread

MAX_TICKS = 2000
INFO = TalkerInfo(
    family="qwen3_tts", model="m", num_code_groups=16, frame_rate_hz=12.5, voices=("ryan",),
    languages=("auto",), variant="custom_voice", default_sampling=SamplingParams(),
    default_subtalker_sampling=SamplingParams(), max_new_frames=64, max_positions=4096,
    catalog=Catalog(voices=(CatalogVoice("ryan"),), languages=(), voice_required=True),
)  # fmt: skip


def poison(engine: TalkerEngine | DuplexEngine, method: str, bad: Callable[..., bool]) -> list[int]:
    """Make ``engine.adapter.<method>`` raise ValueError whenever ``bad(*args)`` holds; returns a list that
    counts the raises."""
    real = getattr(engine.adapter, method)
    raised: list[int] = []

    def faulty(*args: Any, **kw: Any) -> Any:
        if bad(*args, **kw):
            raised.append(1)
            raise ValueError(f"{method}: injected failure")
        return real(*args, **kw)

    setattr(engine.adapter, method, faulty)
    return raised


def run_recovering(engine: TalkerEngine, ids: list[str]) -> tuple[dict[str, list[TalkerOutput]], list[str]]:
    """Step until idle as the engine thread does: a raising tick goes to ``recover``."""
    out: dict[str, list[TalkerOutput]] = {}
    failed: list[str] = []
    for _ in range(MAX_TICKS):
        if not engine.has_work():
            break
        outputs, ended = step_or_recover(engine)
        failed += ended
        for o in outputs:
            out.setdefault(o.request_id, []).append(o)
    assert not engine.has_work()
    assert engine.slots_in_use() == 0 and engine.queue_depth() == 0
    return out, failed


def prepared_of(engine: TalkerEngine, rid: str) -> object:
    return engine._by_id[rid].prepared  # noqa: SLF001 - which prompt belongs to the poisoned request


@pytest.mark.parametrize("where", ["admit", "prefill_many", "start_decode", "launch"])
def test_a_failing_request_ends_alone_and_the_others_equal_their_alone_runs(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer, where: str
) -> None:
    reqs = [request(i, frames=10) for i in range(4)]
    solo = {r.request_id: drive(make_engine(tiny_custom_voice, tiny_tokenizer, 1), [r]) for r in reqs}
    alone = {rid: frames_of(out[rid]) for rid, out in solo.items()}
    engine = make_engine(tiny_custom_voice, tiny_tokenizer, 4, max_num_batched_tokens=64)
    for r in reqs:
        engine.submit(r)
    bad = prepared_of(engine, "r2")
    slot_of_bad = lambda: engine.slot_of("r2")  # noqa: E731
    checks: dict[str, Callable[..., bool]] = {
        "admit": lambda slot, prepared, **kw: prepared is bad,
        "prefill_many": lambda chunks: any(p is bad for _, p, _, _ in chunks),
        "start_decode": lambda slot, prepared: prepared is bad,
        "launch": lambda active, attn_len: slot_of_bad() >= 0 and len(active) > slot_of_bad(),
    }
    raised = poison(engine, where, checks[where])
    out, failed = run_recovering(engine, [r.request_id for r in reqs])
    assert raised and "r2" in failed
    # The frame step covers every row that runs in it: a failure there ends those rows, no other.
    assert failed == ["r2"] or where == "launch"
    for rid in sorted({"r0", "r1", "r2", "r3"} - set(failed)):
        assert out[rid][-1].finish in (Finish.EOS, Finish.MAX_FRAMES), rid
        np.testing.assert_array_equal(frames_of(out[rid]), alone[rid])


def test_the_engine_serves_new_requests_after_a_failed_tick(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    engine = make_engine(tiny_custom_voice, tiny_tokenizer, 2)
    engine.submit(request(0, frames=6))
    bad = prepared_of(engine, "r0")
    poison(engine, "prefill_many", lambda chunks: any(p is bad for _, p, _, _ in chunks))
    _, failed = run_recovering(engine, ["r0"])
    assert failed == ["r0"]
    later = request(1, frames=6)
    out = drive(engine, [later])
    expected = drive(make_engine(tiny_custom_voice, tiny_tokenizer, 1), [later])
    np.testing.assert_array_equal(frames_of(out["r1"]), frames_of(expected["r1"]))


def test_a_follower_of_a_failed_take_is_cancelled(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    engine = make_engine(tiny_custom_voice, tiny_tokenizer, 2)
    engine.submit(request(0, frames=30))
    engine.submit(request(1, frames=4), follows="r0")
    bad = prepared_of(engine, "r0")
    poison(engine, "start_decode", lambda slot, prepared: prepared is bad)
    out, failed = run_recovering(engine, ["r0", "r1"])
    assert failed == ["r0"] and out["r1"][-1].finish is Finish.CANCELLED


def test_the_engine_thread_goes_on_after_a_failed_tick_and_stops_on_a_device_error(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    engine = make_engine(tiny_custom_voice, tiny_tokenizer, 2)
    outputs: list[TalkerOutput] = []
    recovered: list[list[str]] = []
    fatal: list[BaseException] = []
    done = threading.Event()

    def sink(batch: list[TalkerOutput]) -> None:
        outputs.extend(batch)
        if any(o.request_id == "r1" and o.finish is not None for o in batch):
            done.set()

    def on_tick_error(exc: Exception) -> None:
        ids, salvaged = engine.recover(exc)
        recovered.append(ids)
        sink(salvaged)

    thread = EngineThread(engine, sink, name="t", on_error=fatal.append, on_tick_error=on_tick_error)
    thread.start()
    try:

        def submit_poisoned() -> None:  # one command: no tick runs in between
            engine.submit(request(0, frames=6))
            bad = prepared_of(engine, "r0")
            poison(engine, "start_decode", lambda slot, p: p is bad)
            engine.submit(request(1, frames=6))

        thread.call(submit_poisoned).result(10)
        assert done.wait(60)
        assert recovered == [["r0"]] and not fatal and thread.alive
        assert [o.finish for o in outputs if o.request_id == "r1"][-1] in (Finish.EOS, Finish.MAX_FRAMES)

        class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name: a device that cannot go on
            pass

        def broken(*args: Any, **kw: Any) -> Any:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        thread.call(lambda: setattr(engine.adapter, "launch", broken)).result(10)
        thread.call(lambda: engine.submit(request(2, frames=6))).result(10)
        for _ in range(600):
            if not thread.alive:
                break
            threading.Event().wait(0.05)
        assert not thread.alive and len(fatal) == 1 and recovered == [["r0"]]
    finally:
        thread.stop()


def test_the_worker_fails_the_request_through_its_listener_and_serves_the_others(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    """The stage's bridge: the failed request's listener hears ``on_request_failed`` (INTERNAL, naming the
    cause), the other's listener gets all its frames, and no ``on_engine_failed`` / fatal stop happens."""
    engine = make_engine(tiny_custom_voice, tiny_tokenizer, 2)
    poison(engine, "start_decode", lambda slot, p: getattr(engine._by_id.get("r0"), "prepared", None) is p)
    worker = TalkerWorker(engine, INFO, TalkerDefaults.from_deploy(StageConfig(stage_id=0), INFO))

    class Listener:
        def __init__(self) -> None:
            self.outputs: list[TalkerOutput] = []
            self.failed: list[str] = []
            self.done = asyncio.Event()

        def on_output(self, output: TalkerOutput) -> None:
            self.outputs.append(output)
            if output.finish is not None:
                self.done.set()

        def on_engine_failed(self, message: str) -> None:
            raise AssertionError(message)

        def on_request_failed(self, message: str) -> None:
            self.failed.append(message)
            self.done.set()

    async def main() -> tuple[Listener, Listener, list[str]]:
        fatal: list[str] = []
        worker.start(asyncio.get_running_loop(), fatal.append)
        bad, good = Listener(), Listener()
        await worker.submit(request(0, frames=6), bad)
        await worker.submit(request(1, frames=6), good)
        await asyncio.wait_for(asyncio.gather(bad.done.wait(), good.done.wait()), 60)
        worker.stop()
        return bad, good, fatal

    bad, good, fatal = asyncio.run(main())
    assert not fatal and worker.failed is None
    why = "talker: this request failed inside the engine: ValueError: start_decode: injected failure"
    assert bad.failed == [why]
    assert good.outputs[-1].finish in (Finish.EOS, Finish.MAX_FRAMES) and frames_of(good.outputs).size


# -- duplex (PersonaPlex) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["prefill_many", "start_decode"])
def test_a_duplex_session_whose_prefill_fails_ends_alone(where: str) -> None:
    model = fixture_model(load_case("prompt_voice"))
    cfg = DuplexConfig(max_sessions=3, window=model.config.context, prefill_budget=512)
    engine = DuplexEngine(PersonaPlexAdapter(model), cfg, clock=lambda: 0.0)
    sessions = [DuplexRequest(f"s{i}", "", None, None, seed=50 + i, text=TEXT, audio=AUDIO) for i in range(3)]
    for r in sessions:
        engine.open(r)
    # The three join in one step, so their first chunks go as one batched call: it fails, each chunk is
    # redone alone, and only s1's fails again. Or the batch succeeds and s1's start fails.
    s1 = engine._by_id["s1"].prompt
    bad = {
        "prefill_many": lambda chunks: any(prompt is s1 for _, prompt, _, _ in chunks),
        "start_decode": lambda slot, prompt: prompt is s1,
    }
    raised = poison(engine, where, bad[where])
    failed: list[str] = []
    frames: dict[str, int] = {}
    sent = {"s0": 0, "s2": 0}
    for tick in range(40):
        for sid, n in sent.items():
            if engine.session_state(sid) == "decode":
                engine.push_user(sid, n, user_frames(int(sid[1]), n + 1)[n : n + 1])
                sent[sid] += 1
        outputs, ended = step_or_recover(engine)
        failed += ended
        for o in outputs:
            frames[o.session_id] = frames.get(o.session_id, 0) + (o.finish is None)
        if tick >= 10 and engine.session_state("s0") == "decode":
            break
    # prefill_many raises twice: the batched call, then s1's chunk alone.
    assert len(raised) == (2 if where == "prefill_many" else 1)
    assert failed == ["s1"] and engine.session_state("s1") == "absent"
    assert engine.sessions() == 2 and frames.get("s0", 0) > 0 and frames.get("s2", 0) > 0
