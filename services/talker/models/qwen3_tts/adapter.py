"""Qwen3-TTS behind the talker engine's ``TalkerAdapter`` interface.

Owns the device state of all slots: the KV pool, the code predictor's frame-local cache, the per-slot
``FrameState`` (seen c0 codes, frame counters, trailing text queue, sampling rows), each slot's next talker
input and position. ``decode`` runs one masked frame step over slots ``[0, B)`` (B a power-of-two bucket),
which is the unit a CUDA graph captures; launch / collect and the graphs come from
``services.talker.packed`` (shared with Audio8-TTS).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from services.talker.kv import kv_cache_fp8
from services.talker.launch import Pending
from services.talker.packed import PackedDecodeAdapter
from services.talker.sampling import Sampler, SamplingParams
from services.talker.slot_writes import IMMEDIATE, ImmediateWrites, SlotWrites
from services.talker.spec import SpeechSpec
from voxstage.cudagraphs import GraphCache
from voxstage.nn.kv_fp8 import FP8

from .backbone import KVCache
from .config import Qwen3TTSConfig
from .frame import FrameState, frame_step
from .model import Qwen3TTSTalker
from .prefill import PrefillChunk
from .prompt import (
    PromptError,
    PromptParts,
    PromptSpec,
    TalkerPrompt,
    build_prompt,
    icl_text_tokens_needed,
)
from .tokenizer import IncrementalEncoder, QwenTextTokenizer
from .voice_rows import VoiceRows


class QwenPrepared:
    """One request's prompt; streamed text accumulates until the prefill can be built."""

    def __init__(self, adapter: Qwen3TTSAdapter, spec: SpeechSpec) -> None:
        self._adapter = adapter
        self._spec = spec
        tok = adapter.tokenizer
        self._encoder: IncrementalEncoder | None = None
        if spec.text_complete:
            if not spec.text.strip():
                raise PromptError("input: the text to speak is empty")
            self._role, self._text_ids = tok.assistant_ids(spec.text)
        else:
            self._role = tok.role_ids()
            self._encoder = tok.incremental()
            self._text_ids = self._encoder.push(spec.text)
        self._complete = spec.text_complete
        self._instruct = tok.instruct_ids(spec.instructions) if spec.instructions else None
        self._ref_text = tok.ref_text_ids(spec.ref_text) if spec.ref_text else None
        self.prompt: TalkerPrompt | None = None
        self._trailing: list[int] = []
        self._prefix_len = 0
        self._prefix_key: str | None = None
        self._try_build()

    # -- PreparedPrompt --------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.prompt is not None

    @property
    def length(self) -> int:
        if self.prompt is None:
            raise RuntimeError("prompt is not built yet")
        return int(self.prompt.prefill_embeds.shape[0])

    @property
    def trailing_ids(self) -> Sequence[int]:
        return self._trailing

    @property
    def text_complete(self) -> bool:
        return self._complete

    @property
    def prefix_key(self) -> str | None:
        return self._prefix_key

    @property
    def prefix_length(self) -> int:
        return self._prefix_len

    def extend_text(self, text: str, complete: bool) -> None:
        if self._encoder is None or self._complete:
            raise PromptError("text: the text of this request is already complete")
        ids = self._encoder.push(text) + (self._encoder.flush() if complete else [])
        self._complete = complete
        if self.prompt is None:
            self._text_ids += ids
            self._try_build()
            return
        self._trailing += ids + ([self._adapter.config.tts_eos_token_id] if complete else [])

    # -- internals -------------------------------------------------------------------------------------
    def _prompt_spec(self) -> PromptSpec:
        s = self._spec
        emb = None if s.speaker_embedding is None else torch.as_tensor(s.speaker_embedding)  # on the host
        codes = None if s.ref_codes is None else torch.as_tensor(np.asarray(s.ref_codes), dtype=torch.int64)
        non_streaming = s.non_streaming
        if non_streaming is None:
            # The reference's defaults: voice clone streams its text, preset/designed voices do not.
            non_streaming = s.text_complete and self._adapter.config.tts_model_type != "base"
        return PromptSpec(
            role_ids=self._role,
            text_ids=list(self._text_ids),
            language=s.language,
            speaker=s.voice,
            instruct_ids=self._instruct,
            speaker_embedding=emb,
            ref_text_ids=self._ref_text,
            ref_codes=codes,
            non_streaming=non_streaming,
            text_complete=self._complete,
        )

    def _try_build(self) -> None:
        if not self._complete:
            icl = self._ref_text is not None and self._spec.ref_codes is not None
            need = icl_text_tokens_needed(len(self._ref_text or []), len(self._spec.ref_codes)) if icl else 1
            if len(self._text_ids) < need:
                return
        elif not self._text_ids:
            raise PromptError("input: the text to speak is empty")
        s = self._spec
        voice_rows = self._adapter.voice_rows
        known = voice_rows.get(s.speaker_embedding, s.ref_codes)
        spec = dataclasses.replace(self._prompt_spec(), voice=known)
        self.prompt = build_prompt(self._adapter.model, spec, self._adapter.prompt_parts)
        if spec.voice is None and self.prompt.voice is not None:
            voice_rows.put(s.speaker_embedding, s.ref_codes, self.prompt.voice)
        self._trailing = list(self.prompt.trailing_ids)
        # The prefix (instruction, role, codec think/language/speaker part) is a function of these inputs
        # alone, so equal keys mean equal prefix embeddings and reusable KV.
        self._prefix_len = self.prompt.prefix_len
        h = hashlib.sha256(repr((self._instruct, self._role, s.language.lower(), s.voice)).encode())
        if s.speaker_embedding is not None:
            h.update(np.ascontiguousarray(s.speaker_embedding, dtype=np.float32).tobytes())
        self._prefix_key = h.hexdigest()


@dataclass
class _PrefixEntry:
    k: torch.Tensor  # [layers, kv_heads, n, head_dim]
    v: torch.Tensor

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


# A step whose active rows all start from a prefill's hidden state skips the backbone (``decode_core``'s
# ``head_only``); graphed for batch buckets up to this many rows (a lone new request at low load), beyond
# which a step runs whole: its new rows are then recomputed at their last prompt position.
HEAD_ONLY_ROWS = 8


class Qwen3TTSAdapter(PackedDecodeAdapter):
    prefills_last_position = True

    def __init__(
        self,
        model: Qwen3TTSTalker,
        tokenizer: QwenTextTokenizer,
        *,
        prefix_cache_bytes: int = 256 * 1024 * 1024,
        min_attn_bucket: int = 64,
    ) -> None:
        self.model = model
        self.config: Qwen3TTSConfig = model.config
        self.tokenizer = tokenizer
        self.num_groups = model.num_code_groups
        self.codebook_size = model.code_predictor.lm_head[0].out_features
        self.device = model.codec_head.weight.device
        self.dtype = model.codec_head.weight.dtype
        self.prefix_cache_bytes = prefix_cache_bytes
        self.min_attn_bucket = min_attn_bucket
        self._prefixes: OrderedDict[str, _PrefixEntry] = OrderedDict()
        self.voice_rows = VoiceRows()
        self.prompt_parts = PromptParts()  # the rows every prompt shares (engine thread, like the builds)
        self.graphs: GraphCache | None = None
        self.kv_fp8 = False
        self._writes: ImmediateWrites = IMMEDIATE  # a SlotWrites inside ``batched_writes``

    def use_kv_cache_dtype(self, name: str) -> None:
        """``kv_cache_dtype`` (before ``allocate``): ``auto`` keeps the talker's pool in the model dtype,
        ``fp8`` stores it as e4m3 with static per-head scales. The code predictor's frame-local cache stays
        in the model dtype: it is 16 positions per slot, under 1 % of the pool (docs/models.md)."""
        self.kv_fp8 = kv_cache_fp8(name)

    def kv_bytes_per_token(self) -> int:
        return KVCache.bytes_per_token(self.config.talker.backbone, FP8 if self.kv_fp8 else self.dtype)

    def allocate(self, num_slots: int, max_len: int) -> None:
        m, dev = self.model, self.device
        self.kv = m.allocate_kv_cache(num_slots, max_len, fp8=self.kv_fp8)
        self.cp_cache = m.allocate_predictor_cache(num_slots)
        self.state = FrameState.allocate(m, num_slots, max_text=max_len + 1)
        self.next_input = torch.zeros(num_slots, m.hidden_size, device=dev, dtype=self.dtype)
        self.positions = torch.zeros(num_slots, device=dev, dtype=torch.int64)
        self.active = torch.zeros(num_slots, device=dev, dtype=torch.bool)
        self.rows = torch.arange(num_slots, device=dev)
        self.codes_out = torch.zeros(num_slots, self.num_groups, device=dev, dtype=torch.int64)
        self.eos_out = torch.zeros(num_slots, device=dev, dtype=torch.bool)
        # Host copy of each slot's sampler variant (talker and code predictor alike): picks a step's graph.
        self.samplers = [Sampler.GREEDY] * num_slots
        # The prefill's hidden state at a prompt's last position, per slot, and (host) which slots' first
        # step may take it: their prefill ran that position (``prefills_last_position``).
        self.first_h = torch.zeros(num_slots, m.hidden_size, device=dev, dtype=self.dtype)
        self.first_ready = [False] * num_slots
        self.allocate_launch(m, self.kv, num_slots, max_len, self.first_h)

    def prepare(self, spec: SpeechSpec) -> QwenPrepared:
        return QwenPrepared(self, spec)

    def prompt_overhead(self) -> int:
        """The most prompt positions a request takes besides its texts' tokens and its reference frames:
        this checkpoint's longest prompt (a language and an instruction, or a reference transcript and
        clip), built with one-byte texts (one token each in a byte-level BPE) and less those."""
        t = self.model.config.talker
        kind = self.model.config.tts_model_type
        langs = sorted(k for k in t.codec_language_id if "dialect" not in k)
        spec = SpeechSpec(text="a", language=langs[0] if langs else "auto", non_streaming=True)
        if kind == "base":
            zeros = np.zeros(t.backbone.hidden_size, np.float32)
            ref = np.zeros((1, t.num_code_groups), np.int64)
            spec = dataclasses.replace(spec, speaker_embedding=zeros, ref_text="a", ref_codes=ref)
            return self.prepare(spec).length - 3  # text, transcript, one reference frame
        voice = sorted(t.spk_id)[0] if kind == "custom_voice" else None
        return self.prepare(dataclasses.replace(spec, voice=voice, instructions="a")).length - 2

    def admit(
        self,
        slot: int,
        prepared: QwenPrepared,
        *,
        seed: int,
        sampling: SamplingParams,
        subtalker: SamplingParams,
        min_frames: int,
    ) -> None:
        self.state.reset_slot(
            slot, seed=seed, talker=sampling, subtalker=subtalker, trailing_ids=[], text_complete=False,
            min_new_tokens=min_frames, writes=self._writes,
        )  # fmt: skip
        self.samplers[slot] = Sampler.for_params((sampling, subtalker))
        self.first_ready[slot] = False
        self._writes.put(self.positions, slot, 0)

    def append_text(self, slot: int, queued: int, ids: Sequence[int], complete: bool) -> None:
        self.state.append_text(slot, queued, ids, complete, self._writes)

    @contextlib.contextmanager
    def batched_writes(self) -> Iterator[SlotWrites]:
        """A tick's admissions (and its prefill's positions) write their slots' state in one indexed write
        per tensor as it closes (also after one of them failed: the others stay admitted), not ~20 launches
        per slot."""
        writes = self._writes = SlotWrites()
        try:
            yield writes
        finally:
            self._writes = IMMEDIATE
            writes.flush()

    @torch.inference_mode()
    def prefill_many(self, chunks: Sequence[tuple[int, QwenPrepared, int, int]]) -> None:
        """One tick's prefill chunks ``(slot, prompt, start, n)``, batched where they fit (``prefill.py``)."""
        work = []
        for slot, prepared, start, n in chunks:
            assert prepared.prompt is not None
            embeds = prepared.prompt.prefill_embeds[start : start + n].to(self.dtype)
            work.append(PrefillChunk(slot, embeds, start))
        self.prefill_runner.run(work)
        for slot, prepared, start, n in chunks:
            # Parking position: a masked decode row writes its junk K/V here, which the next chunk overwrites.
            self._writes.put(self.positions, slot, start + n)
            # The chunk ran the prompt's last position: its hidden state (``first_h``) is the first step's.
            self.first_ready[slot] = start + n == prepared.length

    def start_decode(self, slot: int, prepared: QwenPrepared) -> None:
        assert prepared.prompt is not None
        self.next_input[slot] = prepared.prompt.prefill_embeds[-1].to(self.dtype)
        self._writes.put(self.positions, slot, prepared.length - 1)

    # -- the tick (launch, collect and CUDA graphs: ``PackedDecodeAdapter``) ---------------------------------
    def step_io(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.active, self.codes_out, self.eos_out

    def variant(self, active: Sequence[bool]) -> tuple[int, ...]:
        # Only active rows count: an inactive row's codes are dropped and its slot state restored below.
        rows = [i for i, a in enumerate(active) if a]
        sampler = int(min((self.samplers[i] for i in rows), default=Sampler.GREEDY))
        head_only = len(active) <= HEAD_ONLY_ROWS and bool(rows) and all(self.first_ready[i] for i in rows)
        return (sampler, int(head_only))

    def variants(self) -> list[tuple[int, ...]]:
        return [(int(v), head_only) for v in Sampler for head_only in (0, 1)]

    def decode_key(self, b: int, length: int, variant: tuple[int, ...]) -> tuple[int, ...] | None:
        if not variant[1]:
            return (b, length, *variant)
        # A head-only step reads no context: one graph per batch bucket, and none past HEAD_ONLY_ROWS.
        return (b, self.min_attn_bucket, *variant) if b <= HEAD_ONLY_ROWS else None

    def launch(self, active: Sequence[bool], attn_len: int) -> Pending:
        handle = super().launch(active, attn_len)
        for i, a in enumerate(active):
            if a:
                self.first_ready[i] = False  # its first step is under way, whichever graph runs it
        return handle

    def set_prefix_cache(self, max_bytes: int) -> None:
        self.prefix_cache_bytes = max_bytes

    def graph_variants(self, sampling: SamplingParams, subtalker: SamplingParams) -> list[Any] | None:
        """The variant requests with these settings decode with (the deploy default's, captured first)."""
        sampler = int(Sampler.for_params((sampling, subtalker)))
        return [(sampler, 0), (sampler, 1)]

    def decode_core(self, b: int, attn_len: int, sampler: int = Sampler.FULL, head_only: int = 0) -> None:
        """The captured unit: static shapes for a given (b, attn_len, sampler variant), no host syncs.
        ``head_only``: every active row's hidden state is its prefill's (``first_h``), whose K/V at this
        position the prefill wrote: the backbone does not run."""
        st = self.state
        active = self.active[:b]
        x = self.next_input[:b].unsqueeze(1)
        pos = self.positions[:b]
        if head_only:
            h = self.first_h[:b]
        else:
            h = self.model(x, pos.unsqueeze(1), self.kv, None, attn_len)[:, 0]
        frames_before = st.frames[:b].clone()
        seen_before = st.seen_c0[:b].clone()
        variant = Sampler(sampler)
        out = frame_step(self.model, h, self.rows[:b], st, self.cp_cache, samplers=(variant, variant))
        st.frames[:b] = torch.where(active, st.frames[:b], frames_before)
        st.seen_c0[:b] = torch.where(active.unsqueeze(1), st.seen_c0[:b], seen_before)
        self.next_input[:b] = torch.where(active.unsqueeze(1), out.next_embed.to(self.dtype), x[:, 0])
        self.positions[:b] = pos + active.to(torch.int64)
        self.codes_out[:b] = out.codes
        self.eos_out[:b] = out.eos & active

    @torch.inference_mode()
    def move_slot(self, src: int, dst: int, kv_len: int) -> None:
        self.kv.copy_slot(src, dst, kv_len)
        for t in (self.next_input, self.positions, self.first_h):
            t[dst] = t[src]
        self.samplers[dst] = self.samplers[src]
        self.first_ready[dst] = self.first_ready[src]
        st = self.state
        for t in (st.seen_c0, st.frames, st.seed, st.seed_key, st.min_new_tokens, st.text_ids, st.text_len,
                  st.text_done):  # fmt: skip
            t[dst] = t[src]
        for table in (st.talker.tensors, st.subtalker.tensors):
            for t in (table.temperature, table.top_k, table.top_p, table.repetition_penalty):
                t[dst] = t[src]

    # -- prefix cache --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def reuse_prefix(self, slot: int, prepared: QwenPrepared, limit: int) -> int:
        key = prepared.prefix_key
        entry = self._prefixes.get(key) if key else None
        if entry is None:
            return 0
        n = min(entry.k.shape[2], limit)
        self._prefixes.move_to_end(key)  # type: ignore[arg-type]
        self.kv.k[:, slot, :, :n] = entry.k[:, :, :n]
        self.kv.v[:, slot, :, :n] = entry.v[:, :, :n]
        self.positions[slot].fill_(n)
        return n

    @torch.inference_mode()
    def store_prefix(self, slot: int, prepared: QwenPrepared) -> None:
        key, n = prepared.prefix_key, prepared.prefix_length
        if not key or n <= 0 or key in self._prefixes:
            return
        entry = _PrefixEntry(self.kv.k[:, slot, :, :n].clone(), self.kv.v[:, slot, :, :n].clone())
        if entry.nbytes > self.prefix_cache_bytes:
            return
        self._prefixes[key] = entry
        while sum(e.nbytes for e in self._prefixes.values()) > self.prefix_cache_bytes:
            self._prefixes.popitem(last=False)
