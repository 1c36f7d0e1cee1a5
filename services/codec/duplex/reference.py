"""Voice recordings of duplex sessions (docs/protocol.md §11): checked, conditioned by the family, encoded.

``check_recording`` holds a recording to the protocol's limits; the family's codec runtime conditions it
(``DuplexCodecRuntime.prepare_recording``: its rate, its loudness, whole frames; numpy only, run by the
worker off both the event loop and the engine thread). ``ReferenceJobs`` encodes prepared recordings on the
engine thread in chunks, each from a fresh state on the pool's reference slot: exact streaming equals the
offline encode, and a long recording delays the other sessions' ticks by at most one chunk.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from voxstage.duplex import MAX_RECORDING_SECONDS
from voxstage.stage.faults import is_device_error

log = logging.getLogger(__name__)


def check_recording(
    pcm: np.ndarray, sample_rate: int, max_seconds: float = MAX_RECORDING_SECONDS
) -> np.ndarray:
    """A voice recording as the protocol allows it (non-empty mono, a positive rate, at most
    ``max_seconds``, finite), as float32; the family's codec conditions it from there
    (``DuplexCodecRuntime.prepare_recording``)."""
    x = np.asarray(pcm, dtype=np.float32)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"reference.audio: must be non-empty mono audio, got shape {x.shape}")
    if sample_rate <= 0:
        raise ValueError(f"reference.audio_sample_rate_hz: must be > 0, got {sample_rate}")
    seconds = x.size / sample_rate
    if seconds > max_seconds:
        raise ValueError(f"reference.audio: {seconds:.1f} s exceeds the limit of {max_seconds:g} s")
    if not np.isfinite(x).all():
        raise ValueError("reference.audio: contains NaN or infinite samples")
    return x


@dataclass
class _Job:
    pcm: np.ndarray
    future: concurrent.futures.Future[np.ndarray]
    done: int = 0  # frames encoded
    codes: list[np.ndarray] = field(default_factory=list)


class ReferenceJobs:
    """FIFO of recordings to encode on ``slot`` of the codec's pool, ``chunk_frames`` per ``step``."""

    def __init__(
        self,
        codec: Any,
        slot: int,
        chunk_frames: int,
        device: torch.device,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.codec = codec
        self.spf: int = codec.samples_per_frame
        self.chunk_frames = chunk_frames
        self.max_frames = int(MAX_RECORDING_SECONDS * codec.sample_rate) // self.spf + 1
        self.device = device
        self.clock = clock
        self._slot = torch.tensor([slot], dtype=torch.int64, device=device)
        self._jobs: deque[_Job] = deque()
        self.chunk_seconds = 0.0  # how long the last chunk took: the slack a chunk needs before a tick

    def submit(self, pcm: np.ndarray) -> concurrent.futures.Future[np.ndarray]:
        pcm = np.asarray(pcm, dtype=np.float32)
        if pcm.ndim != 1 or pcm.size == 0 or pcm.size % self.spf:
            raise ValueError(f"reference.audio: needs whole {self.spf}-sample frames, got shape {pcm.shape}")
        if pcm.size // self.spf > self.max_frames:
            raise ValueError(
                f"reference.audio: more than {self.max_frames} frames ({MAX_RECORDING_SECONDS:g} s)"
            )
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        self._jobs.append(_Job(pcm, future))
        return future

    def pending(self) -> bool:
        return bool(self._jobs)

    def step(self) -> None:
        """Encode the next chunk of the oldest recording; a recording whose caller gave up is dropped."""
        job = self._jobs[0]
        if job.done == 0:
            if not job.future.set_running_or_notify_cancel():
                self._jobs.popleft()
                return
            self.codec.reset(self._slot, "encode")
        total = job.pcm.size // self.spf
        n = min(self.chunk_frames, total - job.done)
        t0 = self.clock()
        try:
            chunk = torch.from_numpy(job.pcm[job.done * self.spf : (job.done + n) * self.spf][None])
            codes = self.codec.encode(chunk.to(self.device), self._slot)
            job.codes.append(codes[0].to("cpu", copy=True).numpy())
        except Exception as exc:  # noqa: BLE001 - one recording's failure is its session's, not the engine's
            if is_device_error(exc):
                raise  # the device is gone for every session: the stage must restart
            log.exception("voice recording encode failed")
            self._jobs.popleft()
            job.future.set_exception(exc)
            return
        self.chunk_seconds = self.clock() - t0
        job.done += n
        if job.done == total:
            self._jobs.popleft()
            job.future.set_result(np.ascontiguousarray(np.concatenate(job.codes, axis=1).T, dtype=np.int64))

    def fail_all(self, exc: BaseException) -> None:
        """The engine stopped: nobody will encode what is queued."""
        while self._jobs:
            future = self._jobs.popleft().future
            if not future.done():
                future.set_exception(exc)
