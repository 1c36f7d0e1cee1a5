"""What every process of a full-duplex session agrees on (docs/protocol.md §11), defined once.

The session's audio frame is fixed by the protocol, whatever family serves it: mono at 24 kHz, cut into
80 ms frames of 1920 samples; the gateway sends one user frame per ``user_audio`` message and the codec
ticks once per frame. A duplex family's codec must run at this frame (its stage refuses to start
otherwise). The two stages' duplex engines refuse a session the same way (``DuplexAdmissionError``: every
slot is held, sessions never queue) and report to their streams through the same listener shape. No torch,
no gRPC: the gateway, the SDK and both stages import this.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

SAMPLE_RATE = 24_000  # Hz
FRAME_SAMPLES = 1920  # one 80 ms frame
FRAME_SECONDS = FRAME_SAMPLES / SAMPLE_RATE
# A voice recording is encoded between ticks in chunks, so its length only delays its own session's open;
# the bound keeps that delay (and the talker's prompt) short: 30 s is 375 frames of a 3000-frame window.
# The gateway refuses a longer one before it reaches the codec.
MAX_RECORDING_SECONDS = 30.0



def regrant_at(window: int) -> int:
    """The least a receiver of a session's SAMPLES flow (the codec's user audio, the gateway's agent audio)
    gives back at once, of a ``window`` it granted: a quarter of it, not a credit message per frame, so the
    sender keeps three quarters in hand and no frame waits for credit (docs/protocol.md §11)."""
    return max(window // 4, 1)


O_contra = TypeVar("O_contra", contravariant=True)


class DuplexAdmissionError(RuntimeError):
    """Every session slot is held (sessions never queue); the protocol answers RESOURCE_EXHAUSTED."""


class DuplexListener(Protocol[O_contra]):
    """A duplex stream as its stage's worker reaches it (on the event loop)."""

    def on_output(self, output: O_contra) -> None: ...

    def on_session_error(self, code: str, message: str) -> None:
        """A session command failed on the engine thread; the session is over."""
        ...

    def on_engine_failed(self, message: str) -> None: ...

    def on_request_failed(self, message: str) -> None:
        """This session's part of a tick failed (not the device); the session is over (INTERNAL)."""
        ...
