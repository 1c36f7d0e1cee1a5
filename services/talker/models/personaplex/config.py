"""PersonaPlex (Moshi-architecture) LM configuration, read the way a moshi checkpoint directory states it.

A checkpoint's ``config.json`` holds the LM constructor arguments under moshi's own names (``dim``,
``num_layers``, ``depformer_dim``, ...) plus file names (``moshi_name``, ``mimi_name``, ``tokenizer_name``,
``mimi_config_name``) and ``model_type``. PersonaPlex ships an **empty** ``config.json``: the architecture
is moshi's hard-coded 7B one. So every key defaults to the released 7B value (``RELEASED``) and a key that is
present overrides it. Options of the moshi LM family that this implementation does not run (conditioners,
LoRA, quantisation, other norms or gatings) are refused at load, naming the key, instead of being ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voxstage.checkpoint import CheckpointError

# The released PersonaPlex / Moshi 7B LM (models.md §3.2).
RELEASED: dict[str, Any] = {
    "dim": 4096,
    "text_card": 32000,
    "existing_text_padding_id": 3,
    "n_q": 16,
    "dep_q": 8,
    "card": 2048,
    "num_heads": 32,
    "num_layers": 32,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 3000,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 1024,
    "depformer_dim_feedforward": 4224,
    "depformer_num_heads": 16,
    "depformer_num_layers": 6,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}
# Settings the implementation is built for: any other value is refused (key named) rather than ignored.
FIXED: dict[str, Any] = {
    "causal": True,
    "layer_scale": None,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
}
# Keys moshi reads that only shape something this LM does not use (the depformer's context is replaced by
# its step count in moshi too; its RoPE period is unused with pos_emb "none").
INERT = ("depformer_context", "depformer_max_period")
FILE_KEYS = ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name", "model_type")
# Files of a released checkpoint directory (moshi's defaults for the names above).
MOSHI_NAME = "model.safetensors"
MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_NAME = "tokenizer_spm_32k_3.model"
MODEL_TYPES = ("moshi", "personaplex")

# Token conventions (models.md §3.3).
ZERO_TOKEN = -1  # embeds to exactly zero: "no input on this stream"
TEXT_EPAD, TEXT_BOS, TEXT_EOS, TEXT_PAD = 0, 1, 2, 3
AGENT_STREAMS = 8  # audio codebooks of one speaker; the user stream has as many


@dataclass(frozen=True)
class LMConfig:
    dim: int
    num_layers: int
    num_heads: int
    hidden_scale: float
    context: int
    max_period: float
    text_card: int
    card: int
    n_q: int
    dep_q: int
    existing_text_padding_id: int
    depformer_dim: int
    depformer_num_layers: int
    depformer_num_heads: int
    depformer_dim_feedforward: int
    delays: tuple[int, ...]
    files: dict[str, str] = field(default_factory=dict)

    # -- derived ------------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def hidden(self) -> int:
        return gated_hidden(self.dim, int(self.hidden_scale * self.dim))

    @property
    def depformer_head_dim(self) -> int:
        return self.depformer_dim // self.depformer_num_heads

    @property
    def depformer_hidden(self) -> int:
        return gated_hidden(self.depformer_dim, self.depformer_dim_feedforward)

    @property
    def num_codebooks(self) -> int:
        """Rows of one token column: text plus every audio stream (17 for PersonaPlex)."""
        return 1 + self.n_q

    @property
    def user_streams(self) -> int:
        return self.n_q - AGENT_STREAMS

    @property
    def steps(self) -> int:
        """Depformer steps served: the agent codebooks. A ``dep_q=16`` checkpoint also carries step sets for
        the user stream, which is teacher-forced; they never influence the agent's tokens, so only the first
        ``AGENT_STREAMS`` sets are loaded."""
        return AGENT_STREAMS

    @property
    def text_initial(self) -> int:
        return self.text_card

    @property
    def audio_initial(self) -> int:
        return self.card

    @property
    def max_delay(self) -> int:
        return max(self.delays)

    def param_count(self) -> int:
        d, dd, s = self.dim, self.depformer_dim, self.steps
        layer = 3 * d * d + d * d + 2 * d + 3 * d * self.hidden
        dep_layer = s * (4 * dd * dd + 3 * dd * self.depformer_hidden) + 2 * dd
        return (
            self.num_layers * layer
            + d  # out_norm
            + (self.text_card + 1) * d + self.text_card * d  # text_emb, text_linear
            + self.n_q * (self.card + 1) * d
            + s * d * dd + (self.text_card + 1) * dd + (s - 1) * (self.card + 1) * dd
            + self.depformer_num_layers * dep_layer
            + s * dd * self.card
        )  # fmt: skip


def gated_hidden(dim: int, dim_feedforward: int) -> int:
    """moshi's gated FFN width: 21/8 of the model width when asked for 4x, else 2/3 of the request."""
    return (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3


def parse_lm_config(raw: dict[str, Any], *, source: str = "config.json") -> LMConfig:
    """Released 7B values, overridden by the keys ``raw`` sets (moshi's names)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: must hold a JSON object")
    known = set(RELEASED) | set(FILE_KEYS)
    # moshi accepts and drops these generation/extra settings; they carry no architecture.
    dropped = {"lm_gen_config", "model_id", "stt_config", "tts_config"}
    unknown = sorted(set(raw) - known - dropped)
    if unknown:
        raise CheckpointError(
            f"{source}: unsupported LM settings {unknown} (voxstage runs the moshi 7B architecture family: "
            "no conditioners, LoRA, quantisation or extra heads)"
        )
    merged = {**RELEASED, **{k: v for k, v in raw.items() if k in RELEASED}}
    for key, want in FIXED.items():
        if merged[key] != want:
            raise CheckpointError(
                f"{source}: {key}={merged[key]!r} is not supported (voxstage needs {want!r})"
            )
    files = {k: str(raw[k]) for k in FILE_KEYS if k in raw}
    model_type = files.get("model_type", "moshi")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"{source}: model_type {model_type!r} is not one of {MODEL_TYPES}")

    def integer(key: str, low: int = 1) -> int:
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CheckpointError(f"{source}: {key} must be an integer >= {low}, got {value!r}")
        return value

    delays = merged["delays"]
    n_q, dep_q = integer("n_q"), integer("dep_q")
    if not isinstance(delays, list) or len(delays) != n_q + 1 or not all(isinstance(d, int) for d in delays):
        raise CheckpointError(f"{source}: delays must be a list of {n_q + 1} integers, got {delays!r}")
    if n_q != 2 * AGENT_STREAMS or dep_q not in (AGENT_STREAMS, n_q):
        raise CheckpointError(
            f"{source}: n_q={n_q}, dep_q={dep_q}: voxstage serves the duplex layout (n_q 16: 8 agent + 8 "
            "user codebooks; dep_q 8, or 16 whose user step sets are not used)"
        )
    if sorted(set(delays)) != [0, 1] or delays[0] != 0 or delays[1] != 0 or delays[1 + AGENT_STREAMS] != 0:
        raise CheckpointError(
            f"{source}: delays {delays} are not supported: text and each stream's first codebook must have "
            "delay 0 and the other codebooks delay 1 (the moshi layout)"
        )
    config = LMConfig(
        dim=integer("dim"),
        num_layers=integer("num_layers"),
        num_heads=integer("num_heads"),
        hidden_scale=float(merged["hidden_scale"]),
        context=integer("context", 2),
        max_period=float(merged["max_period"]),
        text_card=integer("text_card", 4),
        card=integer("card", 2),
        n_q=n_q,
        dep_q=dep_q,
        existing_text_padding_id=integer("existing_text_padding_id", 0),
        depformer_dim=integer("depformer_dim"),
        depformer_num_layers=integer("depformer_num_layers"),
        depformer_num_heads=integer("depformer_num_heads"),
        depformer_dim_feedforward=integer("depformer_dim_feedforward"),
        delays=tuple(delays),
        files=files,
    )
    for dim_key, heads_key in (("dim", "num_heads"), ("depformer_dim", "depformer_num_heads")):
        if merged[dim_key] % merged[heads_key] or (merged[dim_key] // merged[heads_key]) % 2:
            raise CheckpointError(f"{source}: {dim_key} must split into an even head size over {heads_key}")
    return config
