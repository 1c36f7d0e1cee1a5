"""Which stream a ``GraphCache`` captures on (src/voxstage/cudagraphs.py): torch's one capture stream unless
told, and the stream it is given otherwise, which the codec's decode calls pass on (``capture_on``). Two
caches whose graphs replay at once must not share a capture stream: captured GEMMs keep that stream's cuBLAS
workspace. Off a GPU, torch.cuda's capture API is stood in for by recorders;
tests/gpu/test_codec_lanes_cuda.py checks the real captures of both lanes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from services.codec.graphs import GraphedDecode
from voxstage.cudagraphs import GraphCache


class FakeStream:
    def wait_stream(self, other: object) -> None:
        pass


class FakeGraph:
    def replay(self) -> None:
        pass


@pytest.fixture
def captures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ``stream`` each ``torch.cuda.graph`` capture was given."""
    seen: list[Any] = []

    @contextlib.contextmanager
    def graph(g: FakeGraph, pool: object = None, stream: object = None) -> Iterator[None]:
        seen.append(stream)
        yield

    for name, value in {
        "is_available": lambda: True, "graph_pool_handle": lambda: "pool", "Stream": FakeStream,
        "current_stream": FakeStream, "stream": lambda s: contextlib.nullcontext(), "CUDAGraph": FakeGraph,
        "graph": graph, "synchronize": lambda: None,
    }.items():  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, value)
    return seen


def test_a_cache_captures_on_torchs_stream_unless_given_one(captures: list[Any]) -> None:
    calls: list[tuple[int, ...]] = []
    cache = GraphCache(lambda *key: calls.append(key), enabled=True)
    cache.capture(1)
    own = FakeStream()
    cache.capture_stream = own
    cache.run(2)  # captured on first use
    assert captures == [None, own]
    assert calls.count((1,)) == 3 and calls.count((2,)) == 3  # two warm-up runs and the capture, each key


def test_codec_decode_calls_capture_on_the_stream_they_are_given(captures: list[Any]) -> None:
    class Pool:
        max_streams = 4

        def decode(self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            return torch.zeros(codes.shape[0], 8)

    lanes = [GraphedDecode(Pool(), num_groups=2, max_batch=2, frame_buckets=(1,), device="cpu")  # type: ignore[arg-type]
             for _ in range(2)]  # fmt: skip
    streams = [FakeStream(), FakeStream()]
    for calls, stream in zip(lanes, streams, strict=True):
        calls.capture_on(stream)  # type: ignore[arg-type]
        assert calls.capture_all() == 2  # batch buckets 1 and 2, one frame bucket
    assert captures == [streams[0]] * 2 + [streams[1]] * 2
