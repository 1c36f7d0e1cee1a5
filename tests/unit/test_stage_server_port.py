"""A gRPC port that is already taken fails the second server's start instead of being shared with it."""

from __future__ import annotations

import pytest

from voxstage.server import start_stage_server


async def test_a_taken_port_fails_at_start_up() -> None:
    first = await start_stage_server([], host="127.0.0.1", port=0)
    try:
        with pytest.raises(OSError, match=rf"cannot bind gRPC port 127.0.0.1:{first.port}"):
            await start_stage_server([], host="127.0.0.1", port=first.port)
    finally:
        await first.server.stop(None)
