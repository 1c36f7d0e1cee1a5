"""Which failures may end a stage (``voxstage.stage.faults``): a broken device, not a request's error."""

from __future__ import annotations

import pytest
import torch

from voxstage.stage.faults import is_device_error, one_line


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ..."),
        RuntimeError("CUDA error: device-side assert triggered"),
        RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, ...)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
    ],
    ids=["oom", "illegal-access", "device-assert", "cublas", "cudnn"],
)
def test_device_failures_end_the_stage(exc: BaseException) -> None:
    assert is_device_error(exc)


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("text queue overflow (5000 > max_text 4097)"),
        IndexError("index 4096 is out of bounds for dimension 0 with size 4096"),
        RuntimeError("The size of tensor a (3) must match the size of tensor b (4) at dimension 1"),
        KeyError("no running talker request 'r1'"),
        MemoryError(),
        TypeError("unsupported operand"),
    ],
    ids=["value", "index", "shape", "key", "host-memory", "type"],
)
def test_request_failures_do_not(exc: BaseException) -> None:
    assert not is_device_error(exc)


def test_one_line_keeps_the_first_line_and_bounds_it() -> None:
    assert one_line(RuntimeError("CUDA error: x\nmore hints\n")) == "RuntimeError: CUDA error: x"
    assert one_line(ValueError()) == "ValueError"
    assert len(one_line(ValueError("y" * 1000), limit=50)) == 50
