"""What the talker engine needs from a model family.

The engine schedules; the adapter owns every device tensor (KV pool, per-slot frame state, next inputs)
and knows the family's prompt format and frame step. All methods run on the engine thread. The last group
of methods is optional: a family adapter subclasses ``TalkerAdapter`` and keeps the defaults it does not
need (no CUDA graphs, no sampling limits of its own, no prefix cache, no fp8 KV cache, no measured prompt
overhead).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import numpy as np

from services.talker.sampling import SamplingParams


def refuse_kv_cache_dtype(name: str) -> None:
    """The default ``use_kv_cache_dtype``: only ``auto`` (the model dtype) is stored."""
    if name != "auto":
        raise ValueError(f"{name} is not supported by this model family (it stores its KV cache in the "
                         "model dtype only), so use auto")  # fmt: skip


class PreparedPrompt(Protocol):
    """A request's prompt after tokenization; grows when streamed text arrives."""

    @property
    def ready(self) -> bool:
        """Enough text has arrived to build the prefill (streaming modes need the first token(s))."""
        ...

    @property
    def length(self) -> int:
        """Prompt positions (valid once ``ready``)."""
        ...

    @property
    def trailing_ids(self) -> Sequence[int]:
        """Trailing text ids known so far, one consumed per frame (ends with end-of-text once complete)."""
        ...

    @property
    def text_complete(self) -> bool: ...

    @property
    def prefix_key(self) -> str | None:
        """Identity of the voice/instruction prefix (same key => identical prefix embeddings)."""
        ...

    @property
    def prefix_length(self) -> int: ...

    def extend_text(self, text: str, complete: bool) -> None: ...


class TalkerAdapter(Protocol):
    num_groups: int
    codebook_size: int  # every emitted code lies in [0, codebook_size) (EOS rows carry no codes)
    # True: the adapter's prefill can take a prompt's last position too and keep its hidden state, so the
    # slot's first frame step need not run the backbone for it. The engine then prefills the last
    # position whenever a prefill runs anyway (a prompt the prefix cache covers but for its last position
    # still starts from a frame step alone).
    prefills_last_position: bool = False

    def kv_bytes_per_token(self) -> int: ...

    def allocate(self, num_slots: int, max_len: int) -> None:
        """Allocate the KV pool and per-slot state once, before serving."""
        ...

    def prepare(self, spec: Any) -> PreparedPrompt: ...

    def admit(
        self,
        slot: int,
        prepared: PreparedPrompt,
        *,
        seed: int,
        sampling: SamplingParams,
        subtalker: SamplingParams,
        min_frames: int,
    ) -> None: ...

    def append_text(self, slot: int, queued: int, ids: Sequence[int], complete: bool) -> None: ...

    def prefill_many(self, chunks: Sequence[tuple[int, PreparedPrompt, int, int]]) -> None:
        """Write KV for each ``(slot, prompt, start, n)``: prompt positions ``[start, start + n)`` of
        ``slot`` (distinct slots; one tick's prefill work, which the adapter may batch)."""
        ...

    def start_decode(self, slot: int, prepared: PreparedPrompt) -> None:
        """The prompt's last position becomes the slot's first decode input (or, where the prefill took
        that position too, ``prefills_last_position``, its hidden state the first step's)."""
        ...

    def launch(self, active: Sequence[bool], attn_len: int) -> object:
        """Start one frame step for slots ``[0, len(active))``; rows with ``active[i]`` false must not change.

        Returns an opaque handle; the step may still be running on the device when this returns.
        """
        ...

    def collect(self, handle: object) -> tuple[np.ndarray, np.ndarray]:
        """Wait for a launched step: host arrays ``codes [n, G]`` and ``eos [n]`` (inactive rows: junk)."""
        ...

    def move_slot(self, src: int, dst: int, kv_len: int) -> None: ...

    def reuse_prefix(self, slot: int, prepared: PreparedPrompt, limit: int) -> int:
        """Copy a cached identical prefix into ``slot``; returns how many positions were reused (0: miss)."""
        ...

    def store_prefix(self, slot: int, prepared: PreparedPrompt) -> None: ...

    # -- optional, with defaults -------------------------------------------------------------------------
    def use_kv_cache_dtype(self, name: str) -> None:
        """The deploy's ``kv_cache_dtype`` (``auto`` or ``fp8``), before ``allocate`` and
        ``kv_bytes_per_token``; raises ValueError, with the reason, for a value the family cannot store.
        Families without an fp8 cache store the model dtype only."""
        refuse_kv_cache_dtype(name)

    def prompt_overhead(self) -> int | None:
        """The most prompt positions a request takes besides its texts' tokens and its reference frames
        (measured on built prompts, engine thread; ``services.talker.budget``); None: the family cannot say,
        and the talker reports no request limits."""
        return None

    def set_prefix_cache(self, max_bytes: int) -> None:
        """Bound the prefix cache (called once by the engine); families without one ignore it."""
        return None

    def batched_writes(self) -> AbstractContextManager[object]:
        """One tick's admissions (its ``admit`` and ``append_text`` calls), and then its prefill
        (``prefill_many``, ``start_decode``), each happen inside this context: an adapter may gather their
        per-slot device writes and make them together as it closes, before anything reads them
        (``services.talker.slot_writes``). The default makes each write at once."""
        return nullcontext()

    def check_sampling(self, sampling: SamplingParams, subtalker: SamplingParams) -> None:
        """Raise ``ValueError`` naming the field for settings the family cannot honour."""
        return None

    def enable_cuda_graphs(self) -> bool:
        """Run the frame step from CUDA graphs from now on; False when the family has none (eager)."""
        return False

    def graph_variants(self, sampling: SamplingParams, subtalker: SamplingParams) -> list[Any] | None:
        """The decode-graph variants requests with these settings use, to capture first; None: all."""
        return None

    def capture_all_graphs(self, variants: list[Any] | None = None) -> int:
        """Capture every graph before serving (no request in flight); returns how many."""
        return 0
