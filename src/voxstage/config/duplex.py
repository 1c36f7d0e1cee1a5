"""``duplex_session``: full-duplex session limits (read only with ``session_mode: duplex``).

Its own module, like every section the cross-key checks read, so ``checks.py`` can name its type without
importing ``deploy.py`` (which imports the checks).
"""

from __future__ import annotations

from pydantic import Field

from voxstage.config.base import StrictModel


class DuplexSessionConfig(StrictModel):
    """Full-duplex sessions (``session_mode: duplex`` only): the gateway's admission cap and first-audio
    gathering, the codec's per-session jitter buffer and the talker's time for joins per tick."""

    max_sessions: int = Field(default=1, ge=1)
    # User audio the codec buffers per session ahead of its 80 ms ticks (and grants the gateway as credit).
    jitter_buffer_s: float = Field(default=1.0, ge=0.08, le=10.0)
    # Prompt prefill a talker tick runs for joining sessions before the live sessions' step; one call
    # always runs, so a join always progresses (services/talker/duplex/engine.py).
    join_prefill_ms: float = Field(default=20.0, gt=0.0, le=1000.0)
    # Agent audio the gateway gathers before a session's first audio goes out, all of it together: the
    # client's player then starts with slack against later jitter (a burst of joins shifts the live
    # sessions' steps). 0 sends each frame as it comes (gateway/duplex/session.py). At most half of the 2 s of
    # agent audio the codec may send ahead of the client (voxstage.duplex_audio.AGENT_WINDOW_SAMPLES), which
    # gathered audio holds back: at the whole window the codec would wait for credit that never comes.
    first_audio_gather_s: float = Field(default=0.0, ge=0.0, le=1.0)
