"""The duplex engine's batched calls on the codec's slot pool, and the packed move of a session's state.

These are the only places the duplex engine names the pool's calls (``MimiStreamingCodec``): a tick encodes
and a burst decodes over the packed session rows ``[0, B)`` in place (no gather or scatter of the state),
and a leaving session's hole takes the last session's state. Engine-side code: imports torch, no gRPC.
"""

from __future__ import annotations

from typing import Any

import torch


class PackedCalls:
    """The engine's two batched calls over the packed session rows ``[0, B)``."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec

    def encode(self, pcm: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``pcm`` [B, T * spf] -> codes [B, K, T]."""
        return self.codec.encode_packed(pcm, lengths)

    def decode(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``codes`` [B, K, T] -> PCM [B, T * spf]."""
        return self.codec.decode_packed(codes, lengths)

    def capture_all(self) -> int:
        """Capture every graph before serving (the warm-up); returns how many (eager calls have none)."""
        return 0


def move_session_state(codec: Any, src: int, dst: int) -> None:
    """Copy slot ``src``'s encode and decode state (histories and frame positions) onto slot ``dst``."""
    codec.move_slot(src, dst)
