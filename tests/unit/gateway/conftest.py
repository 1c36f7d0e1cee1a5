"""Fixtures: a gateway in this event loop in front of stage doubles (``gateway_fakes.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path

import grpc
import pytest
from duplex_fakes import FakeDuplexCodec, FakeDuplexTalker
from gateway_fakes import FakeCodec, FakeTalker, StageDouble, start_codec, start_talker
from gateway_kit import DUPLEX_SEED, SEED, MakeStack, Stack

from gateway.app import GatewayServer
from voxstage.config import load_deploy_config

TEARDOWN_LIMIT_S = 60.0


async def _bounded(step: Awaitable[object], what: str) -> None:
    """One teardown step, bounded: a stop that hangs fails the test within a minute and prints every task's
    stack (what it waits on), instead of sitting out pytest's 300 s timeout with only thread stacks."""
    try:
        async with asyncio.timeout(TEARDOWN_LIMIT_S):
            await step
    except TimeoutError:
        for task in asyncio.all_tasks():
            with contextlib.suppress(Exception):
                task.print_stack(file=sys.stderr)
        raise AssertionError(f"teardown: {what} did not finish within {TEARDOWN_LIMIT_S:g} s") from None


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("VOXSTAGE_CACHE", str(root))
    return root


@pytest.fixture
async def make_stack(cache: Path) -> AsyncIterator[MakeStack]:
    stacks: list[Stack] = []
    extra: list[StageDouble] = []

    async def make(
        *codecs: FakeCodec,
        talker: FakeTalker | None = None,
        talkers: int = 1,
        overrides: Sequence[str] = (),
        probe_s: float = 0.2,
        host: str = "127.0.0.1",
    ) -> Stack:
        doubles = [await start_codec(c) for c in (codecs or (FakeCodec(),))]
        talker_doubles = [await start_talker(talker if i == 0 else None) for i in range(talkers)]
        extra.extend([*doubles, *talker_doubles])
        config = load_deploy_config(SEED, platform="cpu", overrides=list(overrides))
        gw = GatewayServer(
            config,
            [d.address for d in doubles],
            [t.address for t in talker_doubles],
            host=host,
            grpc_port=0,
            http_port=0,
            grace_s=1.0,
        )
        gw.core.probe_interval_s = probe_s
        await gw.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
        stack = Stack(gw, doubles, talker_doubles, channel)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        await _bounded(stack.channel.close(), "the client channel")
        await _bounded(stack.gateway.stop(), "the gateway's stop")
    # Doubles a test started itself (a revived replica) are stopped too, inside this loop.
    doubles = {id(d): d for d in [*extra, *(d for st in stacks for d in [*st.codecs, *st.talkers])]}
    for double in doubles.values():
        await _bounded(double.server.stop(0), "a stage double")


@pytest.fixture
async def make_duplex_stack(cache: Path) -> AsyncIterator[MakeStack]:
    """A gateway on the PersonaPlex deploy file in front of a duplex codec double (``duplex_fakes.py``)."""
    stacks: list[Stack] = []

    async def make(
        *codecs_given: FakeDuplexCodec,
        overrides: Sequence[str] = (),
        talkers: int = 1,
        talker: FakeDuplexTalker | None = None,
    ) -> Stack:
        """One codec double per ``codecs_given`` (one default double when none), ``talkers`` talkers (the
        first ``talker`` if given)."""
        given = codecs_given or (FakeDuplexCodec(),)
        codecs = [await start_codec(c) for c in given]  # type: ignore[arg-type]
        doubles = [talker or FakeDuplexTalker(), *(FakeDuplexTalker() for _ in range(talkers - 1))]
        talker_doubles = [await start_talker(t) for t in doubles]  # type: ignore[arg-type]
        config = load_deploy_config(DUPLEX_SEED, platform="cpu", overrides=list(overrides))
        gw = GatewayServer(
            config, [c.address for c in codecs], [t.address for t in talker_doubles], host="127.0.0.1",
            grpc_port=0, http_port=0, grace_s=1.0,
        )  # fmt: skip
        await gw.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
        stack = Stack(gw, codecs, talker_doubles, channel)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        await _bounded(stack.channel.close(), "the client channel")
        await _bounded(stack.gateway.stop(), "the gateway's stop")
        for double in [*stack.codecs, *stack.talkers]:
            await _bounded(double.server.stop(0), "a stage double")
