"""Typed Qwen3-TTS talker config parsed from a checkpoint's ``config.json`` + ``generation_config.json``.

Fields the reference config classes default are optional here with the same defaults (so a file the
reference accepts means the same thing to us); fields that shape the weights or the prompt are required.
Every problem raises ``CheckpointError`` naming the file and the dotted field path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from voxstage.checkpoint import CheckpointError

TTSModelType = Literal["base", "custom_voice", "voice_design"]
_MODEL_TYPES: tuple[str, ...] = ("base", "custom_voice", "voice_design")
T = TypeVar("T")
_REQUIRED = object()


class _Fields:
    """Reads typed fields from one JSON object, naming ``source: path.field`` on errors."""

    def __init__(self, data: object, source: str, path: str = "") -> None:
        if not isinstance(data, dict):
            raise CheckpointError(f"{source}: {path or 'top level'} must be a JSON object")
        self.data: dict[str, Any] = data
        self.source = source
        self.path = path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{self.source}: field {self.name(key)} {why}")

    def get(self, key: str, kind: type[T], default: object = _REQUIRED) -> T:
        if key not in self.data or self.data[key] is None:
            if default is _REQUIRED:
                raise self.fail(key, "is missing")
            return cast(T, default)
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise self.fail(key, f"must be {kind.__name__}, got {type(value).__name__} ({value!r})")
        return cast(T, value)

    def positive(self, key: str, default: object = _REQUIRED) -> int:
        value = self.get(key, int, default)
        if value <= 0:
            raise self.fail(key, f"must be > 0, got {value}")
        return value

    def sub(self, key: str) -> _Fields:
        if key not in self.data:
            raise self.fail(key, "is missing")
        return _Fields(self.data[key], self.source, self.name(key))

    def int_map(self, key: str) -> dict[str, int]:
        raw = self.get(key, dict)
        out: dict[str, int] = {}
        for name, value in raw.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.fail(f"{key}.{name}", f"must be int, got {type(value).__name__}")
            out[name.lower()] = value
        return out


@dataclass(frozen=True)
class BackboneConfig:
    """One Qwen3 decoder stack (the talker body or the code-predictor body)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads


@dataclass(frozen=True)
class CodePredictorConfig:
    backbone: BackboneConfig
    vocab_size: int
    num_code_groups: int


@dataclass(frozen=True)
class TalkerConfig:
    backbone: BackboneConfig
    vocab_size: int  # codec vocab: group-0 codes plus the codec specials
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_language_id: dict[str, int]
    spk_id: dict[str, int]
    spk_is_dialect: dict[str, str | None]  # speaker -> dialect language name, or None
    code_predictor: CodePredictorConfig
    mrope_section: tuple[int, ...] | None

    @property
    def suppressed_range(self) -> tuple[int, int]:
        """Codec ids never sampled (except EOS): the reference suppresses the top 1024 of the vocab."""
        return self.vocab_size - 1024, self.vocab_size


@dataclass(frozen=True)
class GenerationDefaults:
    """Defaults from ``generation_config.json`` merged over the reference wrapper's hard defaults."""

    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 2048
    # The reference hard-codes 2 in ``generate`` and never reads it from generation_config.json.
    min_new_tokens: int = 2


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: TalkerConfig
    tts_model_type: TTSModelType
    tts_model_size: str
    tokenizer_type: str
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    speaker_encoder_dim: int | None  # x-vector size (Base); must equal the talker hidden size
    generation: GenerationDefaults


def _backbone(f: _Fields, *, default_head_dim: bool, default_rope_theta: float) -> BackboneConfig:
    hidden = f.positive("hidden_size")
    heads = f.positive("num_attention_heads")
    kv_heads = f.positive("num_key_value_heads")
    head_dim = f.positive("head_dim", hidden // heads if default_head_dim else _REQUIRED)
    if heads % kv_heads:
        raise f.fail("num_key_value_heads", f"({kv_heads}) must divide num_attention_heads ({heads})")
    if head_dim % 2:
        raise f.fail("head_dim", f"must be even for rotary embeddings, got {head_dim}")
    if f.get("attention_bias", bool, False):
        raise f.fail("attention_bias", "is true; Qwen3-TTS attention has no biases and none are loaded")
    if f.get("use_sliding_window", bool, False):
        raise f.fail("use_sliding_window", "is true; only full attention is supported")
    layer_types = f.get("layer_types", list, [])
    if any(kind != "full_attention" for kind in layer_types):
        raise f.fail("layer_types", f"must all be 'full_attention', got {layer_types!r}")
    act = f.get("hidden_act", str, "silu")
    if act != "silu":
        raise f.fail("hidden_act", f"must be 'silu', got {act!r}")
    return BackboneConfig(
        hidden_size=hidden,
        intermediate_size=f.positive("intermediate_size"),
        num_layers=f.positive("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=f.get("rope_theta", float, default_rope_theta),
        rms_norm_eps=f.get("rms_norm_eps", float, 1e-6),
        max_position_embeddings=f.positive("max_position_embeddings", 32768),
    )


def _rope_scaling(f: _Fields, head_dim: int) -> tuple[int, ...] | None:
    if f.data.get("rope_scaling") is None:
        return None
    rs = f.sub("rope_scaling")
    rope_type = rs.get("rope_type", str, rs.get("type", str, "default"))
    if rope_type != "default":
        raise rs.fail("rope_type", f"must be 'default', got {rope_type!r}")
    if "mrope_section" not in rs.data:
        return None
    section = rs.get("mrope_section", list)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in section):
        raise rs.fail("mrope_section", f"must be a list of positive ints, got {section!r}")
    if sum(section) != head_dim // 2:
        raise rs.fail("mrope_section", f"must sum to head_dim/2 = {head_dim // 2}, got {sum(section)}")
    return tuple(section)


def _code_predictor(f: _Fields) -> CodePredictorConfig:
    rs = f.data.get("rope_scaling")
    if rs is not None and (
        not isinstance(rs, dict) or rs.get("rope_type", rs.get("type")) not in (None, "default")
    ):
        raise f.fail("rope_scaling", f"must be null or default rope, got {rs!r}")
    return CodePredictorConfig(
        backbone=_backbone(f, default_head_dim=False, default_rope_theta=10000.0),
        vocab_size=f.positive("vocab_size"),
        num_code_groups=f.positive("num_code_groups"),
    )


def _talker(f: _Fields) -> TalkerConfig:
    backbone = _backbone(f, default_head_dim=True, default_rope_theta=10000.0)
    vocab = f.positive("vocab_size")
    if vocab <= 1024:
        raise f.fail(
            "vocab_size", f"must exceed 1024 (the top 1024 ids are suppressed specials), got {vocab}"
        )
    languages = f.int_map("codec_language_id")
    speakers = f.int_map("spk_id") if f.data.get("spk_id") is not None else {}
    dialect_raw = f.get("spk_is_dialect", dict, {})
    dialects: dict[str, str | None] = {name: None for name in speakers}
    for name, value in dialect_raw.items():
        if value is False or value is None:
            dialects[name.lower()] = None
        elif isinstance(value, str) and value.lower() in languages:
            dialects[name.lower()] = value.lower()
        else:
            raise f.fail(f"spk_is_dialect.{name}", f"must be false or a codec_language_id key, got {value!r}")
    cp = _code_predictor(f.sub("code_predictor_config"))
    groups = f.positive("num_code_groups")
    if cp.num_code_groups != groups:
        raise f.fail("code_predictor_config.num_code_groups", f"({cp.num_code_groups}) must equal {groups}")
    ids = {
        key: f.get(key, int)
        for key in (
            "codec_pad_id",
            "codec_bos_id",
            "codec_eos_token_id",
            "codec_think_id",
            "codec_nothink_id",
            "codec_think_bos_id",
            "codec_think_eos_id",
        )
    }
    for key, value in (
        list(ids.items())
        + [(f"codec_language_id.{k}", v) for k, v in languages.items()]
        + [(f"spk_id.{k}", v) for k, v in speakers.items()]
    ):
        if not 0 <= value < vocab:
            raise f.fail(key, f"= {value} is outside the codec vocabulary [0, {vocab})")
    return TalkerConfig(
        backbone=backbone,
        vocab_size=vocab,
        text_vocab_size=f.positive("text_vocab_size"),
        text_hidden_size=f.positive("text_hidden_size"),
        num_code_groups=groups,
        codec_pad_id=ids["codec_pad_id"],
        codec_bos_id=ids["codec_bos_id"],
        codec_eos_id=ids["codec_eos_token_id"],
        codec_think_id=ids["codec_think_id"],
        codec_nothink_id=ids["codec_nothink_id"],
        codec_think_bos_id=ids["codec_think_bos_id"],
        codec_think_eos_id=ids["codec_think_eos_id"],
        codec_language_id=languages,
        spk_id=speakers,
        spk_is_dialect=dialects,
        code_predictor=cp,
        mrope_section=_rope_scaling(f, backbone.head_dim),
    )


def parse_generation_config(
    data: dict[str, Any] | None, source: str = "generation_config.json"
) -> GenerationDefaults:
    base = GenerationDefaults()
    if data is None:
        return base
    f = _Fields(data, source)
    out = GenerationDefaults(
        do_sample=f.get("do_sample", bool, base.do_sample),
        top_k=f.get("top_k", int, base.top_k),
        top_p=f.get("top_p", float, base.top_p),
        temperature=f.get("temperature", float, base.temperature),
        repetition_penalty=f.get("repetition_penalty", float, base.repetition_penalty),
        subtalker_do_sample=f.get("subtalker_dosample", bool, base.subtalker_do_sample),
        subtalker_top_k=f.get("subtalker_top_k", int, base.subtalker_top_k),
        subtalker_top_p=f.get("subtalker_top_p", float, base.subtalker_top_p),
        subtalker_temperature=f.get("subtalker_temperature", float, base.subtalker_temperature),
        max_new_tokens=f.positive("max_new_tokens", base.max_new_tokens),
    )
    if not 0.0 < out.top_p <= 1.0:
        raise f.fail("top_p", f"must be in (0, 1], got {out.top_p}")
    if out.repetition_penalty <= 0:
        raise f.fail("repetition_penalty", f"must be > 0, got {out.repetition_penalty}")
    return out


def parse_config(
    config: dict[str, Any], generation: dict[str, Any] | None = None, source: str = "config.json"
) -> Qwen3TTSConfig:
    """Build the typed config from the two JSON objects of a checkpoint directory."""
    f = _Fields(config, source)
    model_type = f.get("model_type", str, "qwen3_tts")
    if model_type != "qwen3_tts":
        raise f.fail("model_type", f"must be 'qwen3_tts', got {model_type!r}")
    tts_type = f.get("tts_model_type", str)
    if tts_type not in _MODEL_TYPES:
        raise f.fail("tts_model_type", f"must be one of {', '.join(_MODEL_TYPES)}, got {tts_type!r}")
    talker = _talker(f.sub("talker_config"))
    if tts_type == "custom_voice" and not talker.spk_id:
        raise f.fail("talker_config.spk_id", "must list the preset speakers of a custom_voice model")
    spk_dim: int | None = None
    if tts_type == "base":
        enc = f.sub("speaker_encoder_config") if "speaker_encoder_config" in f.data else _Fields({}, source)
        spk_dim = enc.positive("enc_dim", 1024)
        if spk_dim != talker.backbone.hidden_size:
            raise f.fail(
                "speaker_encoder_config.enc_dim",
                f"({spk_dim}) must equal talker_config.hidden_size ({talker.backbone.hidden_size})",
            )
    return Qwen3TTSConfig(
        talker=talker,
        tts_model_type=cast(TTSModelType, tts_type),
        tts_model_size=f.get("tts_model_size", str, ""),
        tokenizer_type=f.get("tokenizer_type", str, "qwen3_tts_tokenizer_12hz"),
        im_start_token_id=f.get("im_start_token_id", int, 151644),
        im_end_token_id=f.get("im_end_token_id", int, 151645),
        tts_pad_token_id=f.get("tts_pad_token_id", int, 151671),
        tts_bos_token_id=f.get("tts_bos_token_id", int, 151672),
        tts_eos_token_id=f.get("tts_eos_token_id", int, 151673),
        speaker_encoder_dim=spk_dim,
        generation=parse_generation_config(generation),
    )
