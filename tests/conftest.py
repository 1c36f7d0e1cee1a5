"""Shared by every test folder: TF32 off where a CUDA test compares fp32 results."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """TF32 convs/matmuls would make fp32 comparisons at the tests' tolerances (1e-5 to 1e-4) meaningless
    (``pytest.mark.usefixtures("no_tf32")``)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
