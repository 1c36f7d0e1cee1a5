"""What the duplex codec engine and the duplex stream exchange (docs/protocol.md §11), without torch.

The stream layer (event loop, no torch) builds ``AgentFrame``s from the talker's messages and receives the
engine's outputs: one ``UserCodes`` per live session per tick (to the talker) and one ``AgentAudio`` per
agent frame (to the gateway).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voxstage.duplex import SAMPLE_RATE

REFERENCE_RATES = (8000, 192000)  # accepted audio_sample_rate_hz of a voice recording


@dataclass(frozen=True)
class DuplexCodecConfig:
    max_sessions: int
    # User audio a session may buffer (1 s); also the gateway's credit.
    jitter_samples: int = SAMPLE_RATE
    tick_s: float = 0.08
    gather_s: float = 0.005
    max_burst_frames: int = 4  # agent frames of one session decoded in one call (a talker running ahead)
    reference_chunk_frames: int = 25  # voice-recording frames encoded per engine step between ticks
    # User frames in flight to the talker that one session remembers (and agent frames it may hold undecoded).
    record_limit: int = 256

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.tick_s <= 0 or self.gather_s < 0:
            raise ValueError("tick_s must be > 0 and gather_s >= 0")
        if self.max_burst_frames < 1 or self.reference_chunk_frames < 1:
            raise ValueError("max_burst_frames and reference_chunk_frames must be >= 1")


@dataclass(frozen=True)
class AgentFrame:
    """One agent frame from the talker, as the engine decodes it."""

    index: int  # agent frame index in the talker stream (CodecFrames.first_frame)
    codes: np.ndarray  # [num_groups] int64
    text_token: int
    transcript: str
    user_frame: int  # the talker's user frame index that its step consumed; -1: the prompt's step


@dataclass(frozen=True)
class UserCodes:
    """A session's user frame of one tick, encoded: send it to the talker as user frame ``index``."""

    session_id: str
    index: int  # talker user frame index (0, 1, ... per session: one per tick)
    codes: np.ndarray  # [num_groups] int64
    source_frame: int  # the gateway's user frame (sample_offset // 1920) encoded; -1: silence fill
    freed_samples: int  # jitter-buffer samples taken off since the last output (re-grant them)


@dataclass(frozen=True)
class AgentAudio:
    """One agent frame decoded: one session frame of PCM plus what the gateway needs alongside."""

    session_id: str
    frame: int  # agent frame index
    pcm: np.ndarray  # float32, one frame (voxstage.duplex.FRAME_SAMPLES)
    text_token: int
    transcript: str
    user_frame: int  # the gateway's user frame the talker's step consumed; -1: silence fill or prompt
    late: bool  # decoded after its tick's start + one tick


@dataclass(frozen=True)
class SessionInfo:
    slot: int
    live: bool
    buffered: int  # samples of user audio in the jitter buffer
    underflows: int
    late: int
    dropped_samples: int


DuplexOutput = UserCodes | AgentAudio
