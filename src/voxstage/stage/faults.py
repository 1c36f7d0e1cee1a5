"""Which failures may end a stage process, and which belong to one request.

A failure belongs to its request (issue 26): an exception raised while an engine handles one request ends
that request with a status and frees its slot; the engine thread and the process go on. Only a broken device
may end a stage: its state (KV, graphs, streams) can no longer be trusted for anyone, so the process says so
in one line and exits for supervision to restart it. Torch is not imported here: the stage's shared modules
import none, so a device failure is recognised by its type's name and its message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
O = TypeVar("O")
log = logging.getLogger(__name__)

# Types torch raises for a device that cannot go on (torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
# and torch.AcceleratorError share these names).
_DEVICE_TYPES = frozenset({"OutOfMemoryError", "AcceleratorError", "CudaError", "DeviceStalled"})
# What CUDA, cuBLAS, cuDNN, NCCL and HIP put in the RuntimeError they raise once the device or its context
# is gone (an illegal access, a device-side assert, an allocation that failed at graph replay).
_DEVICE_MARKERS = (
    "CUDA error",
    "CUDA out of memory",
    "CUBLAS_STATUS_",
    "CUDNN_STATUS_",
    "cuDNN error",
    "device-side assert",
    "NCCL error",
    "HIP error",
    "out of memory",
)


class DeviceStalled(RuntimeError):
    """Work launched on the device has not finished in far longer than any call takes: a kernel is stuck,
    so no request on it can finish. Raised by an engine that polls its launches instead of waiting on them
    (where a wait would hang the engine thread with no word); a device failure, so the stage restarts."""


def is_device_error(exc: BaseException) -> bool:
    """True for a failure of the accelerator itself (the stage must restart), False for anything a
    request's own data or a bug in handling it could raise (that request ends, the stage serves on)."""
    if any(t.__name__ in _DEVICE_TYPES for t in type(exc).__mro__):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc)
        return any(marker in text for marker in _DEVICE_MARKERS)
    return False


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, at most ``limit`` characters: what a log line or a status says
    about a failure (a CUDA error's message runs over several lines with hints)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def each_alone_on_failure(
    call: Callable[[list[T]], None], parts: list[T], owners: list[O], working: Callable[[list[O]], None]
) -> None:
    """``call(parts)`` as one batch; if it fails, and not for the device, each part again alone, so that the
    part that fails again is the one whose owner ends (``working`` names the owners of the call under way,
    the engine's ``recover`` ends those). Only for calls that write their own parts' state and nothing else,
    so redoing a part is safe."""
    working(owners)
    try:
        call(parts)
    except Exception as exc:
        if len(parts) == 1 or is_device_error(exc):
            raise
        log.warning("a batched call failed (%s); retrying its %d parts one by one", one_line(exc), len(parts))
        for owner, part in zip(owners, parts, strict=True):
            working([owner])
            call([part])
