"""Typed config of the Mimi codec (kyutai), in the nested shape of moshi's ``_mimi_config``.

A kyutai ``mimi_config`` JSON (``{"sample_rate", "channels", "frame_rate", "seanet": {...},
"quantizer": {...}, "transformer": {...}}``) parses with :meth:`MimiConfig.from_dict`; absent keys keep the
released values, so a partial override (``{"transformer": {"context": 10}}``) is enough. Unknown keys and
wrong types raise ``ValueError`` naming the dotted key. Settings the released model fixes and this
implementation does not vary (causal convs, ELU, no conv norm, LayerNorm, RoPE, no gating) are kept for a
faithful round trip but must hold their released value.

``num_codebooks`` (how many of the ``n_q`` codebooks run; 8 for Moshi/PersonaPlex) is not part of moshi's
dict (moshi derives it from the LM); ``from_dict`` accepts it as an optional top-level key and ``to_dict``
leaves it out, so the written JSON is exactly moshi's shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

# Fields whose value is fixed by this implementation: key -> the only accepted value.
_FIXED: dict[str, Any] = {
    "seanet.causal": True,
    "seanet.activation": "ELU",
    "seanet.norm": "none",
    "seanet.pad_mode": "constant",
    "seanet.channels": 1,
    "transformer.causal": True,
    "transformer.conv_layout": True,
    "transformer.gating": "none",
    "transformer.norm": "layer_norm",
    "transformer.positional_embedding": "rope",
    "channels": 1,
}
_NULLABLE = {"transformer.layer_scale"}


@dataclass(frozen=True)
class SeanetConfig:
    channels: int = 1
    dimension: int = 512
    causal: bool = True
    n_filters: int = 64
    n_residual_layers: int = 1
    activation: str = "ELU"
    compress: int = 2
    dilation_base: int = 2
    disable_norm_outer_blocks: int = 0
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    norm: str = "none"
    pad_mode: str = "constant"
    ratios: tuple[int, ...] = (8, 6, 5, 4)
    true_skip: bool = True

    @property
    def hop_length(self) -> int:
        """Input samples per encoder output step (product of the ratios): 960 for the released model."""
        return math.prod(self.ratios)


@dataclass(frozen=True)
class TransformerConfig:
    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 8
    causal: bool = True
    layer_scale: float | None = 0.01
    context: int = 250
    conv_layout: bool = True
    max_period: float = 10000.0
    gating: str = "none"
    norm: str = "layer_norm"
    positional_embedding: str = "rope"
    dim_feedforward: int = 2048
    input_dimension: int = 512
    output_dimensions: tuple[int, ...] = (512,)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


@dataclass(frozen=True)
class QuantizerConfig:
    dimension: int = 256
    n_q: int = 32
    bins: int = 2048
    input_dimension: int = 512
    output_dimension: int = 512


@dataclass(frozen=True)
class MimiConfig:
    sample_rate: int = 24000
    channels: int = 1
    frame_rate: float = 12.5
    seanet: SeanetConfig = field(default_factory=SeanetConfig)
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)
    num_codebooks: int = 8

    def __post_init__(self) -> None:
        for key, value in _flatten(self.to_dict()).items():
            if key in _FIXED and value != _FIXED[key]:
                raise ValueError(f"mimi_config.{key} must be {_FIXED[key]!r} (the only supported value)")
        self._check_sizes()

    def _check_sizes(self) -> None:
        s, t, q = self.seanet, self.transformer, self.quantizer
        positive = {
            "sample_rate": self.sample_rate,
            "seanet.dimension": s.dimension,
            "seanet.n_filters": s.n_filters,
            "seanet.compress": s.compress,
            "seanet.dilation_base": s.dilation_base,
            "seanet.kernel_size": s.kernel_size,
            "seanet.residual_kernel_size": s.residual_kernel_size,
            "seanet.last_kernel_size": s.last_kernel_size,
            "transformer.d_model": t.d_model,
            "transformer.num_heads": t.num_heads,
            "transformer.dim_feedforward": t.dim_feedforward,
            "transformer.context": t.context,
            "quantizer.dimension": q.dimension,
            "quantizer.bins": q.bins,
            "num_codebooks": self.num_codebooks,
        }
        for key, value in positive.items():
            if value < 1:
                raise ValueError(f"mimi_config.{key} must be >= 1, got {value}")
        if not s.ratios or any(r < 1 for r in s.ratios):
            raise ValueError(f"mimi_config.seanet.ratios must be positive integers, got {list(s.ratios)}")
        if s.n_residual_layers < 0 or t.num_layers < 0:
            raise ValueError("mimi_config: seanet.n_residual_layers and transformer.num_layers must be >= 0")
        if self.frame_rate <= 0 or t.max_period <= 0:
            raise ValueError("mimi_config.frame_rate and transformer.max_period must be > 0")
        spf = self.sample_rate / self.frame_rate
        if spf != int(spf) or int(spf) % s.hop_length:
            raise ValueError(
                f"mimi_config: sample_rate / frame_rate ({spf}) must be an integer multiple of the SEANet "
                f"hop (product of seanet.ratios = {s.hop_length})"
            )
        if t.d_model % t.num_heads or (t.d_model // t.num_heads) % 2:
            raise ValueError(
                f"mimi_config.transformer: d_model ({t.d_model}) must split into num_heads ({t.num_heads}) "
                "heads of even size (RoPE rotates pairs)"
            )
        if t.input_dimension != s.dimension or list(t.output_dimensions) != [s.dimension]:
            raise ValueError(
                "mimi_config.transformer: input_dimension and the single entry of output_dimensions must "
                f"equal seanet.dimension ({s.dimension}), got {t.input_dimension} and "
                f"{list(t.output_dimensions)}"
            )
        if q.input_dimension != s.dimension or q.output_dimension != s.dimension:
            raise ValueError(
                "mimi_config.quantizer: input_dimension and output_dimension must equal seanet.dimension "
                f"({s.dimension}), got {q.input_dimension} and {q.output_dimension}"
            )
        if q.n_q < 2:
            raise ValueError(f"mimi_config.quantizer.n_q must be >= 2 (1 semantic + acoustic), got {q.n_q}")
        if self.num_codebooks > q.n_q:
            raise ValueError(
                f"mimi_config.num_codebooks ({self.num_codebooks}) exceeds quantizer.n_q ({q.n_q})"
            )
        if t.context <= self.steps_per_frame:
            raise ValueError(
                f"mimi_config.transformer.context ({t.context}) must exceed the encoder steps per frame "
                f"({self.steps_per_frame})"
            )

    # -- derived geometry --------------------------------------------------------------------------
    @property
    def samples_per_frame(self) -> int:
        """PCM samples per code frame: 1920 at 24 kHz / 12.5 Hz."""
        return int(self.sample_rate / self.frame_rate)

    @property
    def hop_length(self) -> int:
        """Codec hop in samples (one code frame): same as :attr:`samples_per_frame`."""
        return self.samples_per_frame

    @property
    def encoder_hop_length(self) -> int:
        """Samples per SEANet step (960): the transformers run at ``sample_rate / encoder_hop_length``."""
        return self.seanet.hop_length

    @property
    def encoder_frame_rate(self) -> float:
        """Rate of the SEANet latents and of both transformers: 25 Hz."""
        return self.sample_rate / self.encoder_hop_length

    @property
    def steps_per_frame(self) -> int:
        """Transformer steps per code frame: the down/upsampling stride (2 for 25 <-> 12.5 Hz)."""
        return self.samples_per_frame // self.encoder_hop_length

    # -- dict round trip -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """moshi's nested ``_mimi_config`` shape (tuples as lists); ``num_codebooks`` is left out."""
        out: dict[str, Any] = {
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "frame_rate": self.frame_rate,
        }
        for part in ("seanet", "quantizer", "transformer"):
            sub = getattr(self, part)
            out[part] = {f.name: _plain(getattr(sub, f.name)) for f in fields(sub)}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MimiConfig:
        """Parse a (possibly partial) moshi-style dict; absent keys keep the released values."""
        if not isinstance(data, Mapping):
            raise ValueError(f"mimi_config must be a JSON object, got {type(data).__name__}")
        parts = {"seanet": SeanetConfig(), "quantizer": QuantizerConfig(), "transformer": TransformerConfig()}
        top: dict[str, Any] = {}
        defaults = cls()
        for key, value in data.items():
            if key in parts:
                if not isinstance(value, Mapping):
                    raise ValueError(f"mimi_config.{key} must be a JSON object, got {value!r}")
                parts[key] = _override(parts[key], value, key)
            elif key in ("sample_rate", "channels", "frame_rate", "num_codebooks"):
                top[key] = _coerce(key, value, getattr(defaults, key))
            else:
                raise ValueError(f"unknown key mimi_config.{key}")
        return cls(**top, **parts)

    def with_overrides(self, data: Mapping[str, Any]) -> MimiConfig:
        """This config with the keys of a (partial) moshi-style dict replaced."""
        merged = self.to_dict() | {"num_codebooks": self.num_codebooks}
        for key, value in data.items():
            if key in ("seanet", "quantizer", "transformer") and isinstance(value, Mapping):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return MimiConfig.from_dict(merged)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _override(base: Any, data: Mapping[str, Any], part: str) -> Any:
    known = {f.name for f in fields(base)}
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"unknown key mimi_config.{part}.{key}")
        changes[key] = _coerce(f"{part}.{key}", value, getattr(base, key))
    return replace(base, **changes)


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of the field's default (int/float/bool/str/int list)."""
    where = f"mimi_config.{key}"
    if value is None and key in _NULLABLE:
        return None
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be a boolean, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return value
    if isinstance(default, float) or key in _NULLABLE:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or any(
            isinstance(v, bool) or not isinstance(v, int) for v in value
        ):
            raise ValueError(f"{where} must be a list of integers, got {value!r}")
        return tuple(value)
    raise ValueError(f"{where}: unsupported field type {type(default).__name__}")
