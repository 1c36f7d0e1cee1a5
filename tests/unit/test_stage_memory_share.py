"""A stage that holds more device memory after its start-up than its ``gpu_memory_utilization`` share says
so (the codec's CUDA graphs at 256 slots outgrew an 80 GB card beside the talker: docs/benchmarks.md,
seventeenth session); the budget check before start-up sized only weights and state."""

from __future__ import annotations

from voxstage.stage.process import MemoryBudget, held_after_start_up

GIB = 1 << 30


def budget(fraction: float) -> MemoryBudget:
    return MemoryBudget(total=80 * GIB, fraction=fraction, weights=2 * GIB, workspace=4 * GIB)


def test_memory_over_the_share_is_named_with_its_numbers_and_the_knobs() -> None:
    warning = held_after_start_up("codec", budget(0.3), 59 * GIB + GIB // 2)
    assert warning is not None
    assert warning.startswith(
        "codec: holds 59.50 GiB of device memory after start-up, over its share of 24.00 GiB"
    )
    assert "gpu_memory_utilization 0.3 x 80.0 GiB" in warning and "max_num_seqs" in warning


def test_within_the_share_or_without_a_device_budget_nothing_is_said() -> None:
    assert held_after_start_up("talker", budget(0.3), 24 * GIB) is None
    assert held_after_start_up("codec", None, 100 * GIB) is None  # CPU: no device budget
