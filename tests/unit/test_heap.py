"""The garbage collector's passes are observed, and a process's start-up heap is frozen out of them once."""

from __future__ import annotations

import gc

from voxstage import heap, metrics
from voxstage.heap import freeze_startup_heap, watch_gc_pauses


def _passes(generation: str) -> float:
    value = metrics.REGISTRY.get_sample_value("voxstage_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


def test_every_collection_is_observed_by_its_generation() -> None:
    watch_gc_pauses()
    watch_gc_pauses()  # once per process, however often a server starts in it
    before = {g: _passes(g) for g in "012"}
    gc.collect(2)
    gc.collect(0)
    assert _passes("2") == before["2"] + 1
    assert _passes("0") >= before["0"] + 1  # (the allocator may run one of its own meanwhile)
    assert gc.callbacks.count(heap._on_gc) == 1


def test_the_start_up_heap_is_frozen_once() -> None:
    frozen = freeze_startup_heap()
    assert frozen > 0 and gc.get_freeze_count() == frozen
    later = [[object()] for _ in range(1000)]  # what requests make afterwards stays collectable
    assert freeze_startup_heap() == frozen
    assert later  # alive until here


def test_a_load_client_freezes_again_before_each_level() -> None:
    before = heap.freeze()
    kept = [[object()] for _ in range(1000)]  # what a level leaves alive
    assert heap.freeze() >= before + 1000  # freeze() is not once-only, unlike freeze_startup_heap
    assert kept
