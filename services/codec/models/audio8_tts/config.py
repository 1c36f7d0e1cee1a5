"""Geometry of the Audio8 codec (models.md §2.5): the released values and a CPU-sized tiny variant.

The released ``config.json`` names only the post-module's layer/head/ffn counts and the rates (its
``codec_*`` fields); everything else is fixed by the reference code, or (when a checkpoint is at hand)
read off tensor shapes by ``loader.config_from_checkpoint``. ``tiny()`` shrinks the widths and layer counts
but keeps what the serving stack depends on: 44.1 kHz, 2048 samples per frame, strides, codebook sizes,
10 codebooks and the 128-frame attention window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


class Audio8ConfigError(ValueError):
    """An inconsistent codec geometry (the message names the field)."""


@dataclass(frozen=True)
class TransformerGeometry:
    """One window-limited causal transformer (pre-norm RMSNorm, layer scale, interleaved RoPE, SwiGLU)."""

    layers: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    window: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    # The reference's LayerScale init; only random_init and the reference's fresh modules see it.
    layer_scale_init: float = 0.01

    def check(self, where: str) -> None:
        for name in ("dim", "heads", "kv_heads", "head_dim", "ffn", "window"):
            if getattr(self, name) < 1:
                raise Audio8ConfigError(f"{where}.{name} must be >= 1, got {getattr(self, name)}")
        if self.layers < 0:
            raise Audio8ConfigError(f"{where}.layers must be >= 0, got {self.layers}")
        if self.heads % self.kv_heads:
            raise Audio8ConfigError(
                f"{where}.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim % 2:
            raise Audio8ConfigError(
                f"{where}.head_dim must be even (RoPE rotates pairs), got {self.head_dim}"
            )


def _released_post() -> TransformerGeometry:
    # config.json: codec_post_n_layer 8, codec_post_n_head 16, codec_post_n_local_heads 8,
    # codec_post_intermediate_size 1216; head_dim 64 and dim 1024 are fixed in the reference.
    return TransformerGeometry(layers=8, dim=1024, heads=16, kv_heads=8, head_dim=64, ffn=1216, window=128)


def _released_pre() -> TransformerGeometry:
    return TransformerGeometry(layers=8, dim=1024, heads=16, kv_heads=16, head_dim=64, ffn=3072, window=128)


def _released_encoder_transformer() -> TransformerGeometry:
    # In the last encoder block: heads = dim // 64, ffn = 3 * dim, window 512 (reference constants).
    return TransformerGeometry(layers=4, dim=1024, heads=16, kv_heads=16, head_dim=64, ffn=3072, window=512)


@dataclass(frozen=True)
class Audio8CodecConfig:
    sample_rate: int = 44100
    latent_dim: int = 1024
    codebook_dim: int = 8
    semantic_codebook_size: int = 4096
    residual_codebook_size: int = 1024
    num_residual: int = 9
    # Nearest neighbour on L2-normalised vectors (cosine) for the semantic codebook, as documented, and -
    # an assumption - for the residual codebooks too (the DAC-style quantizer uses one lookup for all).
    residual_cosine: bool = True
    post: TransformerGeometry = field(default_factory=_released_post)
    pre: TransformerGeometry = field(default_factory=_released_pre)
    # quantizer.downsample factors; quantizer.upsample applies them in reverse order.
    resample_factors: tuple[int, ...] = (2, 2)
    decoder_channels: int = 1536
    decoder_strides: tuple[int, ...] = (8, 8, 4, 2)
    encoder_channels: int = 64
    encoder_strides: tuple[int, ...] = (2, 4, 8, 8)
    encoder_transformer: TransformerGeometry = field(default_factory=_released_encoder_transformer)

    def __post_init__(self) -> None:
        for name in ("sample_rate", "latent_dim", "codebook_dim", "semantic_codebook_size",
                     "residual_codebook_size", "decoder_channels", "encoder_channels"):  # fmt: skip
            if getattr(self, name) < 1:
                raise Audio8ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_residual < 1:
            raise Audio8ConfigError(f"num_residual must be >= 1, got {self.num_residual}")
        for name in ("resample_factors", "decoder_strides", "encoder_strides"):
            value = getattr(self, name)
            if not value or any(s < 1 for s in value):
                raise Audio8ConfigError(f"{name} must be a non-empty tuple of positive ints, got {value}")
        self.post.check("post")
        self.pre.check("pre")
        self.encoder_transformer.check("encoder_transformer")
        # The reference's post/pre modules have input_proj/output_proj only when dim != latent; no released
        # checkpoint has them, so this code does not build them.
        for name, geom in (("post", self.post), ("pre", self.pre)):
            if geom.dim != self.latent_dim:
                raise Audio8ConfigError(f"{name}.dim ({geom.dim}) must equal latent_dim ({self.latent_dim})")
        if self.encoder_transformer.dim != self.encoder_out_channels:
            raise Audio8ConfigError(
                f"encoder_transformer.dim ({self.encoder_transformer.dim}) must equal the last encoder "
                f"block's width ({self.encoder_out_channels})"
            )
        if self.decoder_channels % 2 ** len(self.decoder_strides):
            raise Audio8ConfigError(
                f"decoder_channels ({self.decoder_channels}) must be divisible by 2**len(decoder_strides)"
            )
        if self.encoder_hop != self.samples_per_frame:
            raise Audio8ConfigError(
                f"encoder hop {self.encoder_hop} (encoder_strides x resample_factors) must equal the "
                f"decoder's samples per frame {self.samples_per_frame}"
            )

    @property
    def num_codebooks(self) -> int:
        return 1 + self.num_residual

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.decoder_strides) * math.prod(self.resample_factors)

    @property
    def encoder_hop(self) -> int:
        return math.prod(self.encoder_strides) * math.prod(self.resample_factors)

    @property
    def encoder_out_channels(self) -> int:
        return self.encoder_channels * 2 ** len(self.encoder_strides)

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.samples_per_frame

    @property
    def window(self) -> int:
        """The post-module's attention window in frames (what a stream's K/V history spans, plus one)."""
        return self.post.window

    @classmethod
    def released(cls) -> Audio8CodecConfig:
        return cls()

    @classmethod
    def tiny(cls) -> Audio8CodecConfig:
        """CPU-sized: post dim 64 (4 q / 2 kv heads of 16, GQA like the released 16/8), 2 post layers,
        decoder channels 96 (-> 6 at 44.1 kHz), encoder 4 -> 64 channels; real rates, strides, codebooks."""
        return cls(
            latent_dim=64,
            post=TransformerGeometry(layers=2, dim=64, heads=4, kv_heads=2, head_dim=16, ffn=96, window=128),
            pre=TransformerGeometry(layers=1, dim=64, heads=1, kv_heads=1, head_dim=64, ffn=192, window=128),
            decoder_channels=96,
            encoder_channels=4,
            encoder_transformer=TransformerGeometry(
                layers=1, dim=64, heads=1, kv_heads=1, head_dim=64, ffn=192, window=512
            ),
        )

    def with_post(
        self, *, layers: int, heads: int, kv_heads: int, ffn: int, head_dim: int | None = None
    ) -> Audio8CodecConfig:
        """This geometry with the post-module fields ``config.json`` names replaced."""
        head_dim = head_dim if head_dim is not None else self.post.dim // heads
        post = replace(self.post, layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn, head_dim=head_dim)
        return replace(self, post=post)
