"""Audio8-TTS behind the talker engine's ``TalkerAdapter`` interface.

Owns the device state of all slots: the slow AR's KV pool, the fast AR's frame-local cache, the per-slot
``FrameState`` (pending input, position, frame clock, sampler row with its RAS window). ``decode_core(b,
attn_len)`` runs the whole frame (``frame.frame_step``) over slots ``[0, b)`` and is what a CUDA graph
captures per (batch, context) bucket; prompts are prefilled by the shared runner
(``services.talker.prefill``), graphed per (rows, length, context) bucket.

Request mapping (``SpeechSpec`` -> prompt, models.md §2.4):

* the text arrives whole: a streamed request (``text_complete`` false) becomes ``ready`` only once its text
  is complete, because the prompt ends with ``<|im_end|>`` and the assistant turn after the text. No text
  is fed per frame (``trailing_ids`` stays empty);
* ``voice``: the model has one voice of its own, ``"default"`` (or none named): the reference's plain
  template. Other voices come from a reference clip (voice clone); speaker tags ``<|speaker:N|>`` may be
  written in the text itself, as the reference processor allows;
* voice clone: ``ref_text`` plus ``ref_codes [T_ref, 10]`` (the codec stage's encoding of the reference
  audio at 44.1 kHz) build the reference's clone template;
* ``language``: only ``auto`` (the worker refuses others): the model has no language token and reads
  the text's language; ``instructions`` are refused; a ``speaker_embedding`` (a Qwen3-TTS x-vector) is
  refused too, since nothing of it reaches this model.

Sampling: the request's parameters sample the semantic token, the ``subtalker`` parameters the fast AR's
codes (the released model uses the same for both); RAS comes from ``config.json``. The released sampler has
no repetition penalty (RAS replaces it): ``check_sampling`` refuses one when the request is built (and the
stage refuses a deploy default), so none reaches ``admit``.

Prefix cache: not implemented; ``reuse_prefix`` returns 0 and ``store_prefix`` does nothing (a plain
prompt's shared prefix is ~15 positions; voice-clone prefixes would profit and are future work).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from services.talker.kv import kv_cache_fp8
from services.talker.packed import PackedDecodeAdapter
from services.talker.prefill import PrefillChunk
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage.cudagraphs import GraphCache
from voxstage.families.audio8_tts import OWN_VOICE
from voxstage.host_copy import to_device
from voxstage.quote import quoted

from .config import Audio8TalkerConfig
from .frame import FrameState, frame_step
from .model import Audio8TTSModel, KVPool
from .prompt import Audio8Prompt, build_prompt
from .sampling import RasParams, check_sampling_params
from .tokenizer import Audio8Tokenizer

DEFAULT_VOICE = OWN_VOICE  # the model speaks in its own voice (voxstage.families.audio8_tts)
VOICES = (DEFAULT_VOICE,)


def check_voice(voice: str | None) -> None:
    """``None`` / ``"default"``: the model's own voice; anything else is refused (ValueError)."""
    if voice is not None and voice.strip().lower() not in ("", DEFAULT_VOICE):
        raise ValueError(
            f"voice: {quoted(voice)} is not a voice of this model: it has one, {DEFAULT_VOICE!r}; clone "
            "another from reference audio and its transcript"
        )


class Audio8Prepared:
    """One request's prompt; a streamed text accumulates until it is complete, then the prompt is built.

    An ``Audio8Prompt`` given instead of a ``SpeechSpec`` is taken as is (pre-tokenized input: benchmarks, a
    weights-only checkpoint without ``tokenizer.json``, golden tests)."""

    def __init__(self, adapter: Audio8TTSAdapter, spec: SpeechSpec | Audio8Prompt) -> None:
        self._adapter = adapter
        self.prompt: Audio8Prompt | None = None
        if isinstance(spec, Audio8Prompt):
            if len(spec) + 1 > adapter.config.max_seq_len:
                raise ValueError(f"prompt: {len(spec)} positions leave no room under max_seq_len")
            self.prompt, self._complete = spec, True
            return
        if adapter.tokenizer is None:
            raise ValueError("text: this checkpoint has no tokenizer.json, so it cannot tokenize requests")
        if spec.instructions:
            raise ValueError("instructions: Audio8 TTS takes no instructions (use a voice or a reference)")
        self._spec = spec
        check_voice(spec.voice)
        if spec.speaker_embedding is not None:
            raise ValueError("reference.x_vector: Audio8 clones from reference codes, not an x-vector")
        self._text = spec.text
        self._complete = spec.text_complete
        if self._complete:
            self._build()

    @property
    def ready(self) -> bool:
        return self.prompt is not None

    @property
    def length(self) -> int:
        if self.prompt is None:
            raise RuntimeError("prompt is not built yet")
        return len(self.prompt)

    @property
    def trailing_ids(self) -> Sequence[int]:
        return ()  # the whole text is in the prompt

    @property
    def text_complete(self) -> bool:
        return self._complete

    @property
    def prefix_key(self) -> str | None:
        return None

    @property
    def prefix_length(self) -> int:
        return 0

    def extend_text(self, text: str, complete: bool) -> None:
        if self._complete:
            raise ValueError("text: the text of this request is already complete")
        self._text += text
        self._complete = complete
        if complete:
            self._build()

    def _build(self) -> None:
        s, a = self._spec, self._adapter
        assert a.tokenizer is not None and isinstance(s, SpeechSpec)
        self.prompt = build_prompt(
            a.tokenizer,
            self._text,
            ref_text=s.ref_text,
            ref_codes=s.ref_codes,
            max_seq_len=a.config.max_seq_len,
        )


class Audio8TTSAdapter(PackedDecodeAdapter):
    """Launch / collect and CUDA graphs come from ``PackedDecodeAdapter`` (shared with Qwen3-TTS); it keeps no
    prefix cache (``set_prefix_cache``'s default)."""

    def __init__(
        self,
        model: Audio8TTSModel,
        tokenizer: Audio8Tokenizer | None,
        *,
        min_attn_bucket: int = 64,
    ) -> None:
        self.model = model
        self.config: Audio8TalkerConfig = model.config
        self.tokenizer = tokenizer
        self.num_groups = self.config.num_codebooks
        self.codebook_size = self.config.codebook_size
        self.device = model.device
        self.dtype = model.dtype
        self.min_attn_bucket = min_attn_bucket
        c = self.config
        self.ras = RasParams(window=c.ras_window_size, temperature=c.ras_temperature, top_p=c.ras_top_p)
        self.graphs: GraphCache | None = None
        model.refresh_head()  # the compact head follows whatever weights the model holds now

    def use_kv_cache_dtype(self, name: str) -> None:
        """Only ``auto``: the slow AR keeps 12 KiB of bf16 K/V per position at 0.6B size (2 KV heads of 64
        over 24 layers), 24 MiB per 2048-position slot, so an fp8 cache would free no memory that bounds
        its sessions, and with its reference unrunnable here its error could not be bounded either."""
        if kv_cache_fp8(name):
            raise ValueError(
                "fp8 is not supported by Audio8-TTS: its KV cache is 12 KiB per position (24 MiB per "
                "2048-position slot in bf16), too small to bound its sessions, so use auto"
            )

    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token()

    def allocate(self, num_slots: int, max_len: int) -> None:
        if max_len > self.config.max_seq_len:
            raise ValueError(
                f"max_model_len {max_len} exceeds the model's max_seq_len {self.config.max_seq_len}"
            )
        self.kv = self.model.allocate_kv(num_slots, max_len)
        self.fast_kv: KVPool = self.model.allocate_fast_kv(num_slots)
        self.state = FrameState.allocate(self.model, num_slots)
        self.allocate_launch(self.model, self.kv, num_slots, max_len)

    # -- requests ------------------------------------------------------------------------------------------
    def prompt_overhead(self) -> int:
        """The most prompt positions a request takes besides its texts' tokens and its reference frames:
        the voice-clone prompt (the longer template) built with one-byte texts and one reference frame."""
        ref = np.zeros((1, self.model.config.num_codebooks), np.int64)
        prepared = self.prepare(SpeechSpec(text="a", ref_text="a", ref_codes=ref))
        return prepared.length - 3

    def prepare(self, spec: SpeechSpec | Audio8Prompt) -> Audio8Prepared:
        return Audio8Prepared(self, spec)

    def check_sampling(self, sampling: SamplingParams, subtalker: SamplingParams) -> None:
        """Refuse what the released sampler cannot do (a repetition penalty), naming the field."""
        check_sampling_params(sampling, "sampling")
        check_sampling_params(subtalker, "subtalker_sampling")

    def admit(
        self,
        slot: int,
        prepared: Audio8Prepared,
        *,
        seed: int,
        sampling: SamplingParams,
        subtalker: SamplingParams,
        min_frames: int,
    ) -> None:
        self.state.reset_slot(slot, self.config.pad_token_id)
        self.state.sampling.reset_slot(
            slot,
            seed=seed,
            params=sampling,
            fast_params=subtalker,
            ras=self.ras,
            min_frames=min_frames,
        )

    def append_text(self, slot: int, queued: int, ids: Sequence[int], complete: bool) -> None:
        """Nothing to queue: prompts are built from the complete text."""

    @torch.inference_mode()
    def prefill_many(self, chunks: Sequence[tuple[int, Audio8Prepared, int, int]]) -> None:
        """Embed each chunk ``(slot, prompt, start, n)``; the shared runner batches the tick's chunks."""
        work = []
        for slot, prepared, start, n in chunks:
            assert prepared.prompt is not None
            ids, codes = prepared.prompt.span(start, start + n)
            # Pinned and non-blocking: a pageable copy would wait for the frame step in flight (async).
            ids_t = to_device(torch.from_numpy(np.ascontiguousarray(ids)), self.device)
            codes_t = to_device(torch.from_numpy(np.ascontiguousarray(codes)), self.device)
            work.append(PrefillChunk(slot, self.model.embed(ids_t, codes_t), start))
        self.prefill_runner.run(work)
        for slot, _, start, n in chunks:
            # Parking position: a masked decode row writes its junk K/V here, which the next chunk overwrites.
            self.state.positions[slot].fill_(start + n)

    def start_decode(self, slot: int, prepared: Audio8Prepared) -> None:
        assert prepared.prompt is not None
        p = prepared.prompt
        self.state.next_ids[slot].fill_(int(p.ids[-1]))
        self.state.next_codes[slot] = torch.from_numpy(np.ascontiguousarray(p.codes[-1]))
        self.state.positions[slot].fill_(len(p) - 1)

    # -- the tick (launch, collect and CUDA graphs: ``PackedDecodeAdapter``) ---------------------------------
    def step_io(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.state.active, self.state.codes_out, self.state.eos_out

    def decode_core(self, b: int, attn_len: int) -> None:
        """The captured unit: static shapes for a given (b, attn_len), no host syncs."""
        frame_step(self.model, self.kv, self.fast_kv, self.state, b, attn_len)

    @torch.inference_mode()
    def move_slot(self, src: int, dst: int, kv_len: int) -> None:
        self.kv.copy_slot(src, dst, kv_len)
        self.state.move(src, dst)

    def reuse_prefix(self, slot: int, prepared: Audio8Prepared, limit: int) -> int:
        return 0  # no prefix cache (see the module docstring)

    def store_prefix(self, slot: int, prepared: Audio8Prepared) -> None:
        return None
