"""Driving an engine as its engine thread does when a tick raises (voxstage.stage.engine_loop): the tick's
failure goes to ``recover``, which names the requests it ended and hands out what the tick made for the
others. Shared by the talker's and the codec's request-failure tests."""

from __future__ import annotations

from typing import Any


def step_or_recover(engine: Any) -> tuple[list[Any], list[str]]:
    """One tick: (its outputs, []); when it raised ValueError, (what ``recover`` salvaged, ended ids)."""
    try:
        return engine.step(), []
    except ValueError as exc:
        ids, outputs = engine.recover(exc)
        return outputs, ids
