"""Shared by the codec tests: one intra-op thread (tiny models are dominated by per-op overhead, and more
threads only oversubscribe small CI machines); TF32 off (``no_tf32``) is in tests/conftest.py."""

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

