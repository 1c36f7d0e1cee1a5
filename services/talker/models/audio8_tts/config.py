"""Audio8-TTS (``arktts``) configuration, read from the checkpoint's flat ``config.json`` (models.md §2.2).

The file uses the DualAR field names (``dim``, ``n_layer``, ``n_local_heads``, ``fast_*``, ``codec_*``, ...).
Every field defaults to the released 0.6B value, so a file that omits one means what the released model
means. Options of the DualAR family that this implementation does not run (q/k norm, an output bias, a
separate LM head, scaled codebook embeddings) are refused at load, naming the field; a ``dim`` that differs
from ``fast_dim`` builds ``fast_project_in``, which the checkpoint must then carry (strict loading names it
if it does not). Keys nobody documents are logged and otherwise ignored: the released file was never seen
verbatim, and refusing it over a metadata key would make the real checkpoint unloadable.

The ``codec_*`` fields describe the codec stage's ``codec.pth``; the codec stage reads them from the same
file, the talker only carries them through.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxstage.checkpoint import CheckpointError, read_json

log = logging.getLogger(__name__)

MODEL_TYPE = "arktts"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"

# Keys a DualAR config may carry that shape nothing at inference (training knobs, HF metadata).
INERT_KEYS = frozenset(
    {
        "model_type", "architectures", "auto_map", "torch_dtype", "dtype", "transformers_version",
        "dropout", "initializer_range", "use_gradient_checkpointing", "bos_token_id", "use_cache",
    }
)  # fmt: skip
# Keys whose released value is the only one implemented: any other value is refused, not ignored.
FIXED_KEYS: dict[str, object] = {
    "attention_qk_norm": False,
    "attention_o_bias": False,
    "fast_attention_qk_norm": False,
    "fast_attention_o_bias": False,
    "tie_word_embeddings": True,
    "scale_codebook_embeddings": False,
    "share_codebook_embeddings": True,
    "is_reward_model": False,
}


@dataclass(frozen=True)
class StackConfig:
    """One transformer stack: the slow AR (24 layers) or the fast AR (4 layers)."""

    dim: int
    n_layer: int
    n_head: int
    n_local_heads: int
    head_dim: int
    intermediate_size: int
    qkv_bias: bool
    norm_eps: float
    rope_base: float

    @property
    def q_size(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_local_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_head // self.n_local_heads

    def param_count(self) -> int:
        d, f = self.dim, self.intermediate_size
        qkv = (self.q_size + 2 * self.kv_size) * (d + (1 if self.qkv_bias else 0))
        return self.n_layer * (qkv + self.q_size * d + 3 * d * f + 2 * d)


@dataclass(frozen=True)
class Audio8TalkerConfig:
    """The flat ``config.json`` (field names as in the file); defaults are the released 0.6B values."""

    vocab_size: int = 155776
    dim: int = 896
    n_layer: int = 24
    n_head: int = 14
    n_local_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 4864
    max_seq_len: int = 2048  # packed prompt + generated frames
    rope_base: float = 1e6
    norm_eps: float = 1e-6
    attention_qkv_bias: bool = True
    attention_qk_norm: bool = False
    attention_o_bias: bool = False
    tie_word_embeddings: bool = True
    codebook_size: int = 4096
    num_codebooks: int = 10
    semantic_begin_id: int = 151678
    semantic_end_id: int = 155773
    eos_token_id: int = 151645  # <|im_end|>
    pad_token_id: int = 151643
    n_fast_layer: int = 4
    fast_dim: int = 896
    fast_n_head: int = 14
    fast_n_local_heads: int = 2
    fast_head_dim: int = 64
    fast_intermediate_size: int = 4864
    fast_attention_qkv_bias: bool = False
    fast_attention_qk_norm: bool = False
    norm_fastlayer_input: bool = True  # the fast AR starts from the slow AR's post-final-norm state
    codec_filename: str = "codec.pth"
    codec_sample_rate: int = 44100
    codec_frame_size: int = 2048
    codec_post_n_layer: int = 8
    codec_post_n_head: int = 16
    codec_post_n_local_heads: int = 8
    codec_post_intermediate_size: int = 1216
    ras_window_size: int = 10
    ras_temperature: float = 1.0
    ras_top_p: float = 0.9

    # -- derived ----------------------------------------------------------------------------------------
    @property
    def slow(self) -> StackConfig:
        return StackConfig(
            self.dim, self.n_layer, self.n_head, self.n_local_heads, self.head_dim, self.intermediate_size,
            self.attention_qkv_bias, self.norm_eps, self.rope_base,
        )  # fmt: skip

    @property
    def fast(self) -> StackConfig:
        return StackConfig(
            self.fast_dim, self.n_fast_layer, self.fast_n_head, self.fast_n_local_heads, self.fast_head_dim,
            self.fast_intermediate_size, self.fast_attention_qkv_bias, self.norm_eps, self.rope_base,
        )  # fmt: skip

    @property
    def num_semantic(self) -> int:
        return self.semantic_end_id - self.semantic_begin_id + 1

    @property
    def head_rows(self) -> int:
        """Rows of the compact LM head: each semantic token, then <|im_end|> (index ``codebook_size``)."""
        return self.codebook_size + 1

    @property
    def has_fast_project_in(self) -> bool:
        return self.dim != self.fast_dim

    @property
    def frame_rate_hz(self) -> float:
        return self.codec_sample_rate / self.codec_frame_size

    def is_semantic(self, token: int) -> bool:
        return self.semantic_begin_id <= token <= self.semantic_end_id

    def to_dict(self) -> dict[str, Any]:
        """The flat ``config.json`` this config reads back from (``model_type`` included)."""
        return {"model_type": MODEL_TYPE, **dataclasses.asdict(self)}

    def param_count(self) -> int:
        """Parameters of the module tree (the tied LM head counted once, as in the checkpoint)."""
        n = self.slow.param_count() + self.fast.param_count()
        n += self.vocab_size * self.dim + self.num_codebooks * self.codebook_size * self.dim + self.dim
        n += 2 * self.codebook_size * self.fast_dim + self.fast_dim
        if self.has_fast_project_in:
            n += self.dim * self.fast_dim + self.fast_dim
        return n


_FIELDS = {f.name: f for f in dataclasses.fields(Audio8TalkerConfig)}


def parse_config(raw: dict[str, Any], source: str = CONFIG_FILE) -> Audio8TalkerConfig:
    """Released values overridden by what ``raw`` sets; raises ``CheckpointError`` naming the field."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: must hold a JSON object")
    model_type = raw.get("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise CheckpointError(f"{source}: model_type {model_type!r} is not {MODEL_TYPE!r}")
    for key, want in FIXED_KEYS.items():
        if key in raw and raw[key] != want:
            raise CheckpointError(
                f"{source}: {key}={raw[key]!r} is not supported (voxstage runs the released Audio8 "
                f"architecture: {key}={want!r})"
            )
    unknown = sorted(set(raw) - set(_FIELDS) - set(FIXED_KEYS) - INERT_KEYS)
    if unknown:
        log.warning("%s: ignoring fields voxstage does not know: %s", source, ", ".join(unknown))
    values: dict[str, Any] = {}
    for name, f in _FIELDS.items():
        if name not in raw or raw[name] is None:
            continue
        values[name] = _typed(raw[name], type(f.default), name, source)
    try:
        config = Audio8TalkerConfig(**values)
    except TypeError as exc:  # pragma: no cover - every field is typed above
        raise CheckpointError(f"{source}: {exc}") from exc
    _validate(config, source)
    return config


def _typed(value: object, kind: type, name: str, source: str) -> object:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise CheckpointError(
            f"{source}: field {name} must be {kind.__name__}, got {type(value).__name__} ({value!r})"
        )
    return value


def _validate(c: Audio8TalkerConfig, source: str) -> None:
    def fail(why: str) -> CheckpointError:
        return CheckpointError(f"{source}: {why}")

    positive = (
        "vocab_size", "dim", "n_layer", "n_head", "n_local_heads", "head_dim", "intermediate_size",
        "max_seq_len", "codebook_size", "n_fast_layer", "fast_dim", "fast_n_head", "fast_n_local_heads",
        "fast_head_dim", "fast_intermediate_size", "codec_sample_rate", "codec_frame_size",
    )  # fmt: skip
    for name in positive:
        if getattr(c, name) <= 0:
            raise fail(f"{name} must be > 0, got {getattr(c, name)}")
    for prefix, stack in (("", c.slow), ("fast_", c.fast)):
        if stack.n_head % stack.n_local_heads:
            raise fail(f"{prefix}n_head {stack.n_head} is not a multiple of {prefix}n_local_heads")
        if stack.head_dim % 2:
            raise fail(f"{prefix}head_dim must be even (rotary pairs), got {stack.head_dim}")
    if c.attention_qk_norm or c.fast_attention_qk_norm or c.attention_o_bias:
        raise fail("q/k norm and an attention output bias are not supported")
    if c.num_codebooks < 2:
        raise fail(f"num_codebooks must be >= 2 (semantic + residual), got {c.num_codebooks}")
    if c.num_semantic != c.codebook_size:
        raise fail(
            f"semantic ids [{c.semantic_begin_id}, {c.semantic_end_id}] hold {c.num_semantic} tokens, "
            f"codebook_size is {c.codebook_size}"
        )
    if c.semantic_end_id >= c.vocab_size or c.semantic_begin_id < 0:
        raise fail(f"semantic ids [{c.semantic_begin_id}, {c.semantic_end_id}] exceed vocab {c.vocab_size}")
    for name in ("eos_token_id", "pad_token_id"):
        token = getattr(c, name)
        if not 0 <= token < c.vocab_size or c.is_semantic(token):
            raise fail(f"{name} {token} must be a non-semantic id below vocab_size {c.vocab_size}")
    if c.max_seq_len < 2:
        raise fail(f"max_seq_len must be >= 2, got {c.max_seq_len}")
    if c.ras_window_size < 0 or not c.ras_temperature >= 0 or not 0 < c.ras_top_p <= 1:
        raise fail(
            f"RAS settings out of range: window {c.ras_window_size}, temperature {c.ras_temperature}, "
            f"top_p {c.ras_top_p}"
        )


def read_config(path: Path | str) -> Audio8TalkerConfig:
    """``config.json`` of a checkpoint directory (or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    return parse_config(read_json(path), source=str(path))


@dataclass(frozen=True)
class GenerationConfig:
    """``generation_config.json``: the checkpoint's sampling defaults (the deploy file overrides them)."""

    temperature: float = 0.7
    top_k: int = 50
    top_p: float = 0.9
    do_sample: bool = True


def parse_generation_config(raw: dict[str, Any], source: str = GENERATION_CONFIG_FILE) -> GenerationConfig:
    """Reads ``temperature``, ``top_k``, ``top_p``, ``do_sample``; other generate() keys carry nothing the
    frame step uses (stopping is ``<|im_end|>`` / ``max_seq_len``, RAS lives in ``config.json``)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: must hold a JSON object")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(GenerationConfig):
        if raw.get(f.name) is not None:
            values[f.name] = _typed(raw[f.name], type(f.default), f.name, source)
    gen = GenerationConfig(**values)
    if gen.temperature < 0 or gen.top_k < 0 or not 0 < gen.top_p <= 1:
        raise CheckpointError(f"{source}: sampling defaults out of range: {gen}")
    return gen


def read_generation_config(checkpoint_dir: Path | str) -> GenerationConfig:
    """The released defaults when the file is absent (it is optional for generate() too)."""
    path = Path(checkpoint_dir) / GENERATION_CONFIG_FILE
    if not path.is_file():
        return GenerationConfig()
    return parse_generation_config(read_json(path), source=str(path))
