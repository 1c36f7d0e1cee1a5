"""Bucketed CUDA-graph capture shared by the talker and codec engines.

A stage's per-tick work is one function of a small integer key (the talker's (batch, context) bucket, the
codec's (batch, frames) bucket) whose inputs and outputs live in static device buffers. ``GraphCache``
captures each key once (after a warm-up run on a side stream, as CUDA requires), shares one memory pool
across all of them (ticks never run concurrently), and replays on later calls. With ``enabled=False`` (CPU,
or ``enforce_eager: true``) it simply calls the function, so both paths share every line of model code.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Hashable

import torch

log = logging.getLogger(__name__)


class GraphCache:
    def __init__(
        self,
        fn: Callable[..., None],
        *,
        enabled: bool,
        warmup_runs: int = 2,
        quiesce: Callable[[tuple[int, ...]], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        """``quiesce(key)`` wraps warm-up and capture: the warm-up runs really execute, so a stateful
        ``fn`` must be made a no-op on its state meanwhile (e.g. every row masked inactive)."""
        self._fn = fn
        self._quiesce = quiesce or (lambda key: contextlib.nullcontext())
        self.enabled = enabled and torch.cuda.is_available()
        self._warmup_runs = warmup_runs
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.enabled else None
        # None: torch's one capture stream for the whole process. A captured GEMM keeps the cuBLAS workspace
        # of the stream it was captured on (pytorch/pytorch#193402), so two caches whose graphs replay at
        # once on two streams (the codec's lanes) must each capture on its own stream, or their GEMMs share
        # one workspace: on an H100 that wedged the codec (docs/benchmarks.md, nineteenth session).
        self.capture_stream: torch.cuda.Stream | None = None
        self.capture_seconds = 0.0

    def __len__(self) -> int:
        return len(self._graphs)

    def keys(self) -> list[Hashable]:
        return list(self._graphs)

    def capture(self, *key: int) -> bool:
        """Capture ``key`` now if it is not yet (start-up pre-capture); True if a graph was captured."""
        if not self.enabled or key in self._graphs:
            return False
        self._graphs[key] = self._capture(key)
        return True

    def run(self, *key: int) -> None:
        if not self.enabled:
            self._fn(*key)
            return
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(key)
        graph.replay()

    def _capture(self, key: tuple[int, ...]) -> torch.cuda.CUDAGraph:
        t0 = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with self._quiesce(key):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            # Warm-up on a side stream: lazy kernel/library initialisation must not happen during capture.
            with torch.cuda.stream(stream):
                for _ in range(self._warmup_runs):
                    self._fn(*key)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph, pool=self._pool, stream=self.capture_stream):
                self._fn(*key)
            torch.cuda.synchronize()
        self._graphs[key] = graph
        self.capture_seconds += time.perf_counter() - t0
        log.info("captured CUDA graph %s in %.0f ms", key, 1e3 * (time.perf_counter() - t0))
        return graph
