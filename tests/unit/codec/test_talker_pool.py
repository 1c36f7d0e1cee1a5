"""The codec's shared channel per talker (``services.codec.upstream.TalkerPool``) when that talker dies under
concurrent requests: every request hears UNAVAILABLE, which lets the gateway try another talker. (Seen in
CI's scale-out test: four requests raced to a just-killed talker; the first one's failed hello closed the
shared channel, and the other three called Status on it, a gRPC usage error that reached the client as
INTERNAL.)"""

from __future__ import annotations

import asyncio

from services.codec.upstream import TalkerPool
from voxstage.stage.errors import StageFailure

DEAD = "127.0.0.1:1"  # nothing listens: connection refused at once


async def test_concurrent_hellos_to_a_dead_talker_all_say_unavailable() -> None:
    pool = TalkerPool(None)
    peer = pool.peer(DEAD)
    results = await asyncio.gather(*(pool.hello(peer) for _ in range(4)), return_exceptions=True)
    assert all(isinstance(r, StageFailure) and r.code == "UNAVAILABLE" for r in results), results
    await pool.close()


async def test_a_dropped_channel_is_replaced_for_requests_that_hold_it() -> None:
    pool = TalkerPool(None)
    peer = pool.peer(DEAD)
    assert pool.current(peer) is peer
    pool.drop(peer)  # another stream to this talker broke
    fresh = pool.current(peer)
    assert fresh is not peer and fresh is pool.peer(DEAD) and pool.current(fresh) is fresh
    await pool.close()
