"""How the codec engine decodes one batch: eagerly here, from CUDA graphs in ``graphs.GraphedDecode``.

``CodecEngine`` calls ``DecodeCalls`` for every decode and the worker's warm-up calls ``capture_all`` once,
before the stage reports SERVING; eager calls capture nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

DecodeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Bucket = Callable[[int, int], bool]  # (batch bucket, frame bucket) -> whether a tick can make that call


class DecodeCalls:
    """The engine's decode of a batch ``(codes, slots, lengths) -> PCM``, eager through ``decode``."""

    def __init__(self, decode: DecodeFn) -> None:
        self.decode = decode

    def __call__(self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.decode(codes, slots, lengths)

    def capture_all(self, max_frames: int | None = None, keep: Bucket | None = None) -> int:
        """Capture every graph before serving (the warm-up); returns how many (eager calls have none)."""
        return 0

    def captured(self) -> int:
        """How many graphs are captured so far (eager calls have none)."""
        return 0

    def capture_on(self, stream: torch.cuda.Stream) -> None:
        """Capture later graphs on ``stream``, the one they will replay on (eager calls capture nothing).
        Why: a captured GEMM keeps the cuBLAS workspace of the stream it was captured on, so graphs that
        replay at once on two streams (``lanes``) must not share a capture stream."""
