"""Shared by the codec tests: one intra-op thread (tiny models are dominated by per-op overhead, and more
threads only oversubscribe small CI machines), and TF32 off for the CUDA tests that ask for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """TF32 convs/matmuls would make fp32 comparisons at 1e-5 meaningless (``usefixtures("no_tf32")``)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
