"""The TTS codec worker's frames in (services/codec/worker.py), on the real tiny decoder and engine thread:
pushes are fire and forget, every stream's pushes of one turn of the event loop reach the engine thread in
one hand-off, later commands (finish, cancel) come after them, and a push that fails ends its stream only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from test_engine import codes_for, make_engine, offline

from services.codec.engine import CodecOutput
from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.worker import CodecWorker
from voxstage.stage.errors import StageFailure

TOL = 1e-5


class Listener:
    def __init__(self) -> None:
        self.pcm: list[np.ndarray] = []
        self.errors: list[tuple[str, str]] = []
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_pcm(self, output: CodecOutput) -> None:
        self.pcm.append(output.pcm)
        if output.final and not self.done.done():
            self.done.set_result("final")

    def on_engine_failed(self, message: str) -> None:
        self._end("ENGINE", message)

    def on_request_failed(self, message: str) -> None:
        self._end("REQUEST", message)

    def on_session_error(self, code: str, message: str) -> None:
        self._end(code, message)

    def _end(self, code: str, message: str) -> None:
        self.errors.append((code, message))
        if not self.done.done():
            self.done.set_result(code)


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


@pytest_asyncio.fixture
async def worker(model: Qwen3TokenizerDecoder) -> AsyncIterator[CodecWorker]:
    # The runtime serves warm-up and reference encodes only, which these tests do not call.
    w = CodecWorker(None, make_engine(model, streams=3, async_scheduling=True))  # type: ignore[arg-type]
    w.start(asyncio.get_running_loop())
    try:
        yield w
    finally:
        w.stop()


def count_handoffs(worker: CodecWorker) -> list[int]:
    """Counts the worker's calls onto its engine thread (the first element)."""
    calls = [0]
    real = worker._thread.call  # noqa: SLF001 - the hand-off under test

    def counted(fn: Any) -> Any:
        calls[0] += 1
        return real(fn)

    worker._thread.call = counted  # type: ignore[method-assign]  # noqa: SLF001
    return calls


async def open_streams(worker: CodecWorker, ids: str) -> dict[str, Listener]:
    listeners = {sid: Listener() for sid in ids}
    for sid, listener in listeners.items():
        await worker.open(sid, initial_frames=1, prefix=None, listener=listener)
    return listeners


@pytest.mark.asyncio
async def test_a_turns_pushes_reach_the_engine_in_one_handoff_and_decode_as_offline(
    worker: CodecWorker, model: Qwen3TokenizerDecoder
) -> None:
    codes = {sid: codes_for(i, 40) for i, sid in enumerate("abc")}
    listeners = await open_streams(worker, "abc")
    handoffs = count_handoffs(worker)
    for t in range(40):
        before = handoffs[0]
        for sid in "abc":  # one turn of the loop: a tick's frames of every stream, as the link delivers them
            worker.push(sid, codes[sid][t : t + 1])
        await asyncio.sleep(0)  # the turn ends: its pushes go over
        assert handoffs[0] - before == 1
    for sid in "abc":
        await worker.finish(sid)
    assert (
        await asyncio.wait_for(asyncio.gather(*(ls.done for ls in listeners.values())), 30) == ["final"] * 3
    )
    for sid, listener in listeners.items():
        np.testing.assert_allclose(np.concatenate(listener.pcm), offline(model, codes[sid]), atol=TOL)


@pytest.mark.asyncio
async def test_a_push_that_fails_ends_its_stream_only(
    worker: CodecWorker, model: Qwen3TokenizerDecoder
) -> None:
    codes = codes_for(7, 30)
    listeners = await open_streams(worker, "ab")
    worker.push("b", codes[:2])
    await worker.finish("b")
    worker.push("a", codes)
    worker.push("b", codes[2:4])  # after its end: the engine refuses it
    await worker.finish("a")
    await asyncio.wait_for(listeners["a"].done, 30)
    assert await asyncio.wait_for(listeners["b"].done, 30) == "INVALID_ARGUMENT"
    code, message = listeners["b"].errors[0]
    assert code == "INVALID_ARGUMENT" and "already ended" in message
    assert listeners["a"].errors == []
    np.testing.assert_allclose(np.concatenate(listeners["a"].pcm), offline(model, codes), atol=TOL)
    snapshot = await worker.snapshot()
    assert snapshot.slots_in_use == 0  # b's slot went back with its failure, a's with its end


@pytest.mark.asyncio
async def test_a_cancel_comes_after_the_pushes_before_it(worker: CodecWorker) -> None:
    listeners = await open_streams(worker, "a")
    engine, order = worker.engine, []
    push, cancel = engine.push, engine.cancel
    engine.push = lambda sid, codes: (order.append("push"), push(sid, codes))[1]  # type: ignore[method-assign]
    engine.cancel = lambda sid: (order.append("cancel"), cancel(sid))[1]  # type: ignore[method-assign]
    worker.push("a", codes_for(1, 3))
    worker.cancel("a")  # the push is handed over first, so it finds its stream open
    snapshot = await worker.snapshot()
    assert order == ["push", "cancel"]
    assert snapshot.slots_in_use == 0
    assert listeners["a"].errors == [] and not listeners["a"].done.done()


@pytest.mark.asyncio
async def test_an_open_is_handed_over_at_once_and_codes_pushed_before_its_answer_follow_it(
    worker: CodecWorker, model: Qwen3TokenizerDecoder
) -> None:
    """The stream's codec opens the talker while the engine opens the stream: the open must reach the engine
    thread before the call returns, so frames pushed before its answer is awaited find the stream open."""
    handoffs = count_handoffs(worker)
    listener, codes = Listener(), codes_for(3, 12)
    opening = worker.open("a", initial_frames=1, prefix=None, listener=listener)
    assert handoffs[0] == 1  # no await yet
    worker.push("a", codes)
    await worker.finish("a")
    assert await opening >= 0
    assert await asyncio.wait_for(listener.done, 30) == "final"
    np.testing.assert_allclose(np.concatenate(listener.pcm), offline(model, codes), atol=TOL)


@pytest.mark.asyncio
async def test_room_is_what_the_engine_holds_and_a_refused_open_forgets_its_listener(
    worker: CodecWorker,
) -> None:
    await open_streams(worker, "abc")
    assert not worker.has_room()  # three streams: the engine's every slot
    refused = worker.open("a", initial_frames=1, prefix=None, listener=Listener())  # already open
    with pytest.raises(StageFailure) as err:
        await refused
    assert err.value.code == "INVALID_ARGUMENT" and "already open" in err.value.message
    worker.cancel("b")
    assert worker.has_room()
    snapshot = await worker.snapshot()
    assert snapshot.slots_in_use == 2
