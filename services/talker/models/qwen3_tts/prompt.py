"""Prompt construction for the three Qwen3-TTS variants, as ``Qwen3TTSForConditionalGeneration.generate``
builds it (models.md §1.4), plus the host-side bookkeeping of streamed text.

Notation: ``E_c`` is the codec embedding, ``P(T(x))`` the projected text embedding, ``pad/bos/eos`` the
projected ``tts_pad/tts_bos/tts_eos`` vectors. The prefill is

    [P(T(instruct))]? ++ P(T(role)) ++ ([pad]*(n-2) ++ [bos]) + E_c(codec_prefix[:-1]) ++ tail

with ``codec_prefix = [think|nothink, think_bos, (lang), think_eos, (speaker), codec_pad, codec_bos]`` and
``tail`` depending on the mode:

* streaming text: ``P(T(text[0])) + E_c(codec_bos)``; trailing text = ``text[1:] ++ [tts_eos]``;
* non-streaming: ``(P(T(text ++ [tts_eos])) + E_c(codec_pad)) ++ (pad + E_c(codec_bos))``; no trailing text;
* ICL voice clone: ``ids = ref_text ++ text ++ [tts_eos]`` against
  ``codec = [codec_bos] ++ frames(ref_codes)``;
  streaming sums them over the overlap (excess text becomes trailing text, a short text is padded with
  ``pad``), non-streaming puts all text first (``+ E_c(codec_pad)``) then ``codec + pad``.

Trailing text is always a list of text *ids* (each frame projects its own); its vectors are projected only
when asked for (``TalkerPrompt.trailing_embeds``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from voxstage.host_copy import to_device, upload
from voxstage.quote import quoted

from .model import Qwen3TTSTalker


class PromptError(ValueError):
    """A request cannot be turned into a prompt for this checkpoint; the message names the field."""


@dataclass(frozen=True)
class PromptSpec:
    """Token-level description of one request (ids from ``tokenizer.QwenTextTokenizer``)."""

    role_ids: Sequence[int]  # "<|im_start|>assistant\n" (3 ids)
    text_ids: Sequence[int]  # the text to speak (template stripped); may grow later when streamed
    language: str = "auto"
    speaker: str | None = None  # CustomVoice preset speaker
    instruct_ids: Sequence[int] | None = None  # whole "<|im_start|>user\n...<|im_end|>\n" block
    speaker_embedding: torch.Tensor | None = None  # Base: x-vector [H] from the codec stage's encoder
    ref_text_ids: Sequence[int] | None = None  # Base ICL: reference transcript ids
    ref_codes: torch.Tensor | None = None  # Base ICL: reference codec frames [T_ref, G]
    non_streaming: bool = False
    text_complete: bool = True  # False: more text deltas will follow (streaming modes only)
    voice: VoiceEmbeds | None = None  # this reference's rows from an earlier prompt (TalkerPrompt.voice)


@dataclass(frozen=True)
class VoiceEmbeds:
    """The rows of a clone prompt that depend on the reference alone, on the model's device: built once per
    voice-library voice and reused, so a request by that voice does none of its reference's embedding work.
    The same ops on the same inputs either way, so a prompt is bit for bit the same with or without them."""

    speaker: torch.Tensor  # [H]: the x-vector in the model's dtype
    icl_codec: torch.Tensor | None  # [1 + T_ref, H]: E_c(codec_bos) ++ frames(ref_codes); None without ICL
    # The prefix rows with this speaker's row, by language codec id (None: auto): at most one entry a
    # language the checkpoint knows, living as long as the voice's rows do.
    prefixes: dict[int | None, torch.Tensor] = field(default_factory=dict, compare=False)

    def prefix(self, lang_id: int | None, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        rows = self.prefixes.get(lang_id)
        if rows is None:
            rows = self.prefixes[lang_id] = build()
        return rows


@dataclass
class TalkerPrompt:
    prefill_embeds: torch.Tensor  # [T, H]
    trailing_ids: list[int]  # consumed one per generated frame; ends with tts_eos iff text_complete
    pad_embed: torch.Tensor  # [H], used once trailing text is exhausted (and complete)
    text_complete: bool
    ref_codes: torch.Tensor | None = None  # prepend to the generated frames before decoding (ICL)
    tts_eos_id: int = 151673
    # Leading prefill rows that depend only on instruct/role/language/speaker, never on the text (the
    # span a prefix cache can share between requests).
    prefix_len: int = 0
    voice: VoiceEmbeds | None = None  # a clone's reference rows, for the next prompt of the same reference
    project: Callable[[Sequence[int]], torch.Tensor] | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def trailing_embeds(self) -> torch.Tensor:
        """``[N, H] = embed_text(trailing_ids)``, projected when first asked for: the serving engine projects
        each frame's trailing token inside its step and never asks (a projection call is host time on the
        engine thread, served); the reference's loop and the tests do."""
        if not self.trailing_ids:
            return self.pad_embed.new_zeros((0, self.pad_embed.shape[-1]))
        assert self.project is not None, "a prompt built by build_prompt knows its projection"
        return self.project(self.trailing_ids)

    def text_feed(self) -> TextFeed:
        return TextFeed(queued=len(self.trailing_ids), complete=self.text_complete, eos_id=self.tts_eos_id)


@dataclass
class TextFeed:
    """Host-side view of one slot's trailing-text queue (no device reads needed).

    Starvation rule: generating frame ``t`` consumes trailing token ``t`` to form the next input, so a slot
    may run frame ``t`` only if ``t < queued`` or the text is complete (then ``tts_pad`` follows the queued
    ``tts_eos``). Otherwise the slot is input-starved: the engine skips it for the tick and reports it
    (moshi's MISSING_WORDS) instead of letting it read ``pad`` before the text has ended.
    """

    queued: int
    complete: bool
    eos_id: int

    def starved(self, frames_done: int) -> bool:
        return not self.complete and frames_done >= self.queued

    def push(self, ids: Sequence[int], complete: bool = False) -> list[int]:
        """Register new text ids (and maybe the end of text); returns the ids to append on device."""
        if self.complete:
            raise PromptError("text: the text of this request is already complete")
        out = list(ids) + ([self.eos_id] if complete else [])
        self.queued += len(out)
        self.complete = complete
        return out


class PromptParts:
    """The rows of a prompt that no request changes, built once on the model's device: the text specials
    (``tts_bos/eos/pad``), the codec specials, the role line, each language's think rows, each preset
    speaker's row, each instruction's rows and the prefix they make, up to ``max_entries`` parts and
    ``max_bytes`` of device memory (instructions are the users' and may be long). A request then
    pays for its own text's rows alone, which at a join burst of hundreds is the engine thread's time
    between frame steps. Each part is the output of the very call that would build it per request, and
    gathers and elementwise sums do not depend on the shape they run at, so a prompt is bit for bit the same
    with or without (``tests/unit/talker/test_qwen3_tts_prompt_parts.py``). Owned by the engine thread."""

    def __init__(self, max_entries: int = 256, max_bytes: int = 32 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._parts: dict[tuple[object, ...], torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._parts)

    def get(self, key: tuple[object, ...], build: Callable[[], torch.Tensor]) -> torch.Tensor:
        part = self._parts.get(key)
        if part is None:
            part = build()
            size = part.numel() * part.element_size()
            # Past the bounds (many or long instructions): built for its request, not kept.
            if len(self._parts) < self.max_entries and self.bytes + size <= self.max_bytes:
                self._parts[key] = part
                self.bytes += size
        return part


NO_PARTS = PromptParts(max_entries=0)  # keeps nothing: every part built for its request


def _ids(model: Qwen3TTSTalker, ids: Sequence[int]) -> torch.Tensor:
    # The engine thread builds prompts while a frame step is in flight: a pageable copy would wait for it.
    return upload(list(ids), model.codec_head.weight.device)


@torch.no_grad()
def project_text(model: Qwen3TTSTalker, ids: Sequence[int]) -> torch.Tensor:
    """``P(T(ids))``: text ids -> talker-width rows on the model's device."""
    return model.embed_text(_ids(model, ids))


def validate_spec(
    model: Qwen3TTSTalker, spec: PromptSpec, parts: PromptParts = NO_PARTS
) -> tuple[int | None, torch.Tensor | None]:
    """Check the request against the variant; returns (language codec id or None, speaker vector or None).
    Raises ``PromptError`` naming the offending field."""
    cfg = model.config
    t = cfg.talker
    kind = cfg.tts_model_type
    if len(spec.role_ids) != 3:
        raise PromptError(
            f"role_ids: expected the 3 ids of '<|im_start|>assistant\\n', got {len(spec.role_ids)}"
        )
    if not spec.text_ids:
        raise PromptError("text: the text to speak must contain at least one token")
    if not spec.text_complete and spec.non_streaming:
        raise PromptError("non_streaming: non-streaming mode needs the whole text up front")
    for name, ids in (
        ("text_ids", spec.text_ids),
        ("role_ids", spec.role_ids),
        ("instruct_ids", spec.instruct_ids),
        ("ref_text_ids", spec.ref_text_ids),
    ):
        # min/max over the list: a C loop, not a generator's frame per id (a clone's transcript is ~150)
        if ids and (min(ids) < 0 or max(ids) >= t.text_vocab_size):
            raise PromptError(f"{name}: token ids must lie in [0, {t.text_vocab_size})")

    language = spec.language.lower()
    lang_id: int | None = None
    if language != "auto":
        if language not in t.codec_language_id or "dialect" in language:
            names = sorted(k for k in t.codec_language_id if "dialect" not in k)
            raise PromptError(
                f"language: {quoted(spec.language)} is not supported; use auto or one of {', '.join(names)}"
            )
        lang_id = t.codec_language_id[language]

    speaker_vec: torch.Tensor | None = None
    if spec.speaker:
        if kind != "custom_voice":
            raise PromptError(f"speaker: preset speakers need a custom_voice checkpoint, this one is {kind}")
        name = spec.speaker.lower()
        if name not in t.spk_id:
            raise PromptError(f"speaker: {quoted(spec.speaker)} is not one of {', '.join(sorted(t.spk_id))}")
        spk = t.spk_id[name]
        speaker_vec = parts.get(("speaker", spk), lambda: model.embed_codec(_ids(model, [spk]))[0])
        dialect = t.spk_is_dialect.get(name)
        if dialect is not None and language in ("chinese", "auto"):
            lang_id = t.codec_language_id[dialect]
    elif kind == "custom_voice":
        raise PromptError("speaker: a custom_voice checkpoint needs a preset speaker")

    if spec.instruct_ids is not None and kind == "base":
        raise PromptError("instruct: base (voice clone) checkpoints take no instruction")

    icl = spec.ref_codes is not None or spec.ref_text_ids is not None
    if kind == "base":
        if spec.speaker_embedding is None:
            raise PromptError("speaker_embedding: a base checkpoint needs the reference x-vector")
        emb = spec.speaker_embedding
        if emb.shape != (t.backbone.hidden_size,):
            raise PromptError(
                f"speaker_embedding: expected shape [{t.backbone.hidden_size}], got {list(emb.shape)}"
            )
        if spec.voice is not None:
            speaker_vec = spec.voice.speaker
        else:
            # A copy: on the CPU the rows must not share the request's host array (VoiceRows keys on it).
            weight = model.codec_head.weight
            speaker_vec = to_device(emb, weight.device).to(weight.dtype, copy=True)
        if icl and (spec.ref_codes is None or not spec.ref_text_ids):
            raise PromptError(
                "ref_text/ref_codes: voice-clone ICL needs both the transcript and the reference codes"
            )
        if spec.ref_codes is not None and spec.voice is None:  # voice rows: built from these checked codes
            rc = spec.ref_codes
            groups = t.num_code_groups
            if rc.dim() != 2 or rc.shape[1] != groups or rc.shape[0] < 1 or rc.dtype.is_floating_point:
                raise PromptError(
                    f"ref_codes: expected integer codes [T_ref >= 1, {groups}], got {list(rc.shape)}"
                )
            cb = t.code_predictor.vocab_size
            if bool(((rc < 0) | (rc >= cb)).any()):
                raise PromptError(f"ref_codes: codes must lie in [0, {cb})")
    elif spec.speaker_embedding is not None or icl:
        raise PromptError(
            f"speaker_embedding/ref_codes: voice cloning needs a base checkpoint, this one is {kind}"
        )
    return lang_id, speaker_vec


@torch.no_grad()
def build_prompt(model: Qwen3TTSTalker, spec: PromptSpec, parts: PromptParts = NO_PARTS) -> TalkerPrompt:
    """Turn ``spec`` into prefill embeddings and the trailing text stream for ``model``; ``parts`` keeps
    the rows no request changes for the next prompt of the same model."""
    cfg = model.config
    t = cfg.talker
    lang_id, speaker_vec = validate_spec(model, spec, parts)
    specials = [cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]
    bos, eos, pad = parts.get(("text_specials",), lambda: project_text(model, specials))
    codec_specials = [t.codec_pad_id, t.codec_bos_id]
    pad_bos = parts.get(("codec_specials",), lambda: model.embed_codec(_ids(model, codec_specials)))
    codec_bos = pad_bos[-1:]

    def prefix_rows() -> torch.Tensor:
        """``text_side + codec_prefix[:-1]``: the think rows, the speaker's and the codec pad, under
        pad/bos."""
        if lang_id is None:
            think = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
        else:
            think = [t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id]
        codec = [parts.get(("think", lang_id), lambda: model.embed_codec(_ids(model, think)))]
        if speaker_vec is not None:
            codec.append(speaker_vec.unsqueeze(0))
        codec.append(pad_bos)
        codec_prefix = torch.cat(codec, dim=0)
        n = codec_prefix.shape[0]
        text_side = torch.cat([pad.expand(n - 2, -1), bos.unsqueeze(0)], dim=0)
        return text_side + codec_prefix[:-1]

    pieces = []
    if spec.instruct_ids:
        instruct = tuple(spec.instruct_ids)
        pieces.append(parts.get(("text", instruct), lambda: project_text(model, instruct)))
    role = tuple(spec.role_ids)
    pieces.append(parts.get(("text", role), lambda: project_text(model, role)))
    voice = spec.voice
    if voice is None and spec.speaker_embedding is not None:  # a clone: its reference's rows, for reuse
        assert speaker_vec is not None  # validate_spec
        voice = VoiceEmbeds(speaker_vec, _icl_codec(model, spec))
    if voice is None:  # a preset speaker's or none: the same rows for every request
        pieces.append(parts.get(("prefix", lang_id, spec.speaker and spec.speaker.lower()), prefix_rows))
    else:  # a clone's x-vector row sits among them: the same rows for every request by that voice
        pieces.append(voice.prefix(lang_id, prefix_rows))
    prefix_len = sum(p.shape[0] for p in pieces)
    text_ids = list(spec.text_ids)
    codec_pad = pad_bos[0]  # a gather's row: the same values as gathering it once per position
    if voice is not None and voice.icl_codec is not None and spec.ref_text_ids is not None:
        tail, trailing = _icl_tail(
            model, spec, list(spec.ref_text_ids), voice.icl_codec, text_ids, pad, eos, codec_pad
        )
        pieces.append(tail)
    elif spec.non_streaming:
        body = torch.cat([project_text(model, text_ids), eos.unsqueeze(0)], dim=0)
        body = body + codec_pad.expand(len(text_ids) + 1, -1)
        pieces += [body, parts.get(("pad_codec_bos",), lambda: pad.unsqueeze(0) + codec_bos)]
        trailing = []
    else:
        pieces.append(project_text(model, text_ids[:1]) + codec_bos)
        trailing = text_ids[1:] + ([cfg.tts_eos_token_id] if spec.text_complete else [])

    return TalkerPrompt(
        prefill_embeds=torch.cat(pieces, dim=0),
        trailing_ids=trailing,
        pad_embed=pad,
        text_complete=spec.text_complete,
        ref_codes=spec.ref_codes,
        tts_eos_id=cfg.tts_eos_token_id,
        prefix_len=prefix_len,
        voice=voice,
        project=functools.partial(project_text, model),
    )


def _icl_codec(model: Qwen3TTSTalker, spec: PromptSpec) -> torch.Tensor | None:
    """The codec side of an ICL prompt, ``E_c(codec_bos) ++ frames(ref_codes)``: the given one if any."""
    if spec.ref_codes is None:
        return None
    if spec.voice is not None and spec.voice.icl_codec is not None:
        return spec.voice.icl_codec
    ref_codes = to_device(spec.ref_codes.to(torch.int64), model.codec_head.weight.device)
    bos = model.embed_codec(_ids(model, [model.config.talker.codec_bos_id]))
    return torch.cat([bos, model.embed_frame(ref_codes)], dim=0)


def icl_text_tokens_needed(ref_text_len: int, ref_frames: int) -> int:
    """Streaming ICL overlaps ``ref_text ++ text`` with ``1 + ref_frames`` codec positions; until the text
    ends, the prefill needs at least this many target-text tokens (fewer only once the text is complete)."""
    return max(1, 1 + ref_frames - ref_text_len)


def _icl_tail(
    model: Qwen3TTSTalker,
    spec: PromptSpec,
    ref_text_ids: list[int],
    codec: torch.Tensor,
    text_ids: list[int],
    pad: torch.Tensor,
    eos: torch.Tensor,
    codec_pad: torch.Tensor,
) -> tuple[torch.Tensor, list[int]]:
    """``codec``: the codec side, ``E_c(codec_bos) ++ frames(ref_codes)``; ``codec_pad``: ``E_c(codec_pad)``
    (a row per text position in non-streaming mode)."""
    cfg = model.config
    all_ids = ref_text_ids + text_ids
    codec_len = codec.shape[0]
    if not spec.text_complete and len(all_ids) < codec_len:
        need = icl_text_tokens_needed(len(ref_text_ids), codec_len - 1)
        raise PromptError(
            f"text: streaming voice-clone ICL needs {need} text tokens (or the end of text) before prefill, "
            f"got {len(text_ids)}"
        )
    # Project the whole id run at once and slice afterwards, as the reference does.
    text = project_text(model, all_ids)
    if spec.text_complete:
        text = torch.cat([text, eos.unsqueeze(0)], dim=0)
    ids = all_ids + ([cfg.tts_eos_token_id] if spec.text_complete else [])
    if spec.non_streaming:
        text = text + codec_pad.expand(text.shape[0], -1)
        return torch.cat([text, codec + pad], dim=0), []
    if len(ids) > codec_len:
        return text[:codec_len] + codec, ids[codec_len:]
    text = torch.cat([text, pad.expand(codec_len - len(ids), -1)], dim=0)
    return text + codec, []
