"""Qwen3-TTS 12 Hz tokenizer encoder: 24 kHz reference audio -> codes ``[16, T]`` at 12.5 Hz.

Structure (``Qwen3TTSTokenizerV2Encoder``, a Mimi model without its decoder half):
causal SEANet conv stack (960x down to 25 Hz) -> causal transformer with layer scale and RoPE ->
stride-2 downsample conv (12.5 Hz) -> split RVQ (1 semantic + 15 acoustic of the 32 trained quantizers).

Module names follow the ``encoder.*`` keys of ``speech_tokenizer/model.safetensors`` (HF-4.57 Mimi names)
with the leading ``encoder.`` removed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from voxstage.checkpoint import CheckpointError, load_state_dict_strict, read_json
from voxstage.nn.layers import apply_rope, rope_cos_sin, rope_inv_freq

from .checkpoint_io import read_prefixed_tensors
from .encoder_config import EncoderConfig, real_encoder_config, tiny_encoder_config
from .encoder_quantizer import SplitResidualVectorQuantizer, unused_quantizer_keys
from .reference_audio import DEFAULT_MAX_SECONDS, MODEL_SAMPLE_RATE, prepare_reference_audio

__all__ = [
    "EncoderConfig",
    "Qwen3TTSEncoder",
    "load_qwen3_tts_encoder",
    "random_init_encoder",
    "real_encoder_config",
    "tiny_encoder_config",
]


class CausalConv1d(nn.Module):
    """Mimi's causal conv: left-pad by (effective kernel - stride), then right-pad just enough that the
    last window is complete, so ``ceil(T / stride)`` frames come out and no output sees the future."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.padding_total = (kernel - 1) * dilation + 1 - stride
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        extra = -(-length // self.stride) * self.stride - length
        x = F.pad(x, (self.padding_total, extra), mode=self.pad_mode)
        return self.conv(x)


class ResnetBlock(nn.Module):
    """SEANet residual unit: ELU, dilated conv to dim/compress, ELU, 1x1 conv back, plus the skip."""

    def __init__(self, config: EncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // config.compress
        pad = config.pad_mode
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                CausalConv1d(dim, hidden, config.residual_kernel_size, dilation=dilation, pad_mode=pad),
                nn.ELU(),
                CausalConv1d(hidden, dim, 1, pad_mode=pad),
            ]
        )
        self.shortcut = CausalConv1d(dim, dim, 1, pad_mode=pad) if config.use_conv_shortcut else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.shortcut(x) if self.shortcut is not None else x
        for layer in self.block:
            x = layer(x)
        return residual + x


class SeanetEncoder(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        pad = config.pad_mode
        width = config.num_filters
        # ELUs are list entries of their own so that conv indices match the checkpoint's ``layers.N``.
        layers: list[nn.Module] = [CausalConv1d(1, width, config.kernel_size, pad_mode=pad)]
        for ratio in reversed(config.upsampling_ratios):
            for j in range(config.num_residual_layers):
                layers.append(ResnetBlock(config, width, config.dilation_growth_rate**j))
            layers += [nn.ELU(), CausalConv1d(width, width * 2, ratio * 2, stride=ratio, pad_mode=pad)]
            width *= 2
        layers += [nn.ELU(), CausalConv1d(width, config.hidden_size, config.last_kernel_size, pad_mode=pad)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class EncoderAttention(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        h, d, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        # Full causal attention, not a 250-frame window: the reference (HF 4.57 Mimi) builds its mask with
        # ``create_causal_mask``, which ignores ``sliding_window``, and parity with it is the contract.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class EncoderMLP(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.approximate = "none" if config.hidden_act == "gelu" else "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class EncoderLayer(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.self_attn = EncoderAttention(config)
        self.mlp = EncoderMLP(config)
        self.input_layernorm = nn.LayerNorm(h, eps=config.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=config.norm_eps)
        self.self_attn_layer_scale = LayerScale(h, config.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(h, config.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class EncoderTransformer(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))
        self.head_dim, self.rope_theta = config.head_dim, config.rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Angles are formed per call in fp32 (no buffer) so a module cast to bf16 keeps exact angles.
        positions = torch.arange(x.shape[1], device=x.device)
        cos, sin = rope_cos_sin(positions, rope_inv_freq(self.head_dim, self.rope_theta, x.device), x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Qwen3TTSEncoder(nn.Module):
    """Waveform ``[B, N]`` (24 kHz, mono) -> codes ``[B, valid_num_quantizers, ceil(N / 1920)]``."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = SeanetEncoder(config)
        self.encoder_transformer = EncoderTransformer(config)
        self.downsample = CausalConv1d(
            config.hidden_size,
            config.hidden_size,
            config.downsample_kernel,
            stride=2,
            bias=False,
            pad_mode="replicate",
        )
        self.quantizer = SplitResidualVectorQuantizer(config)

    @property
    def num_quantizers(self) -> int:
        return self.config.valid_num_quantizers

    def num_frames(self, num_samples: int) -> int:
        return math.ceil(num_samples / self.config.samples_per_frame)

    def latent(self, wave: torch.Tensor) -> torch.Tensor:
        """Pre-quantization latent ``[B, hidden, frames]`` (exposed for parity diagnostics)."""
        if wave.dim() == 2:
            wave = wave[:, None]
        if wave.dim() != 3 or wave.shape[1] != 1:
            raise ValueError(f"wave must be [batch, samples] or [batch, 1, samples], got {tuple(wave.shape)}")
        if wave.shape[-1] == 0:
            raise ValueError("wave has no samples")
        dtype = self.downsample.conv.weight.dtype
        x = self.encoder(wave.to(dtype))
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        return self.downsample(x)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        return self.quantizer.encode(self.latent(wave))

    @torch.inference_mode()
    def encode_reference(
        self,
        audio: np.ndarray | torch.Tensor,
        sample_rate: int,
        *,
        max_seconds: float = DEFAULT_MAX_SECONDS,
    ) -> torch.Tensor:
        """One reference clip (any rate, ``[samples]`` or ``[samples, channels]`` float PCM) -> CPU int64
        codes ``[num_quantizers, frames]``, one frame per 1920 samples at 24 kHz (a partial last frame
        counts)."""
        wave = prepare_reference_audio(
            audio, sample_rate, max_seconds=max_seconds, target_rate=self.config.sampling_rate
        )
        device = self.downsample.conv.weight.device
        codes = self(wave[None].to(device))[0]
        # Same cut as the reference (ceil(samples / encode_downsample_rate)); a no-op for one clip since the
        # strided convs already produce exactly that many frames.
        return codes[:, : math.ceil(wave.shape[0] / self.config.downsample_rate)].cpu()


def _codebooks_to_fp32(model: Qwen3TTSEncoder) -> None:
    # Codebooks stay fp32 in half-precision deployments: nearest-centroid search is where bf16 rounding
    # would flip codes, and the tables are small.
    for cb in model.quantizer.codebooks():
        cb.cluster_usage.data = cb.cluster_usage.data.float()
        cb.embed_sum.data = cb.embed_sum.data.float()


def random_init_encoder(
    config: EncoderConfig | Mapping[str, Any],
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Qwen3TTSEncoder:
    """Random weights with a fixed seed (tests, demos, size-true benchmarks).

    Mimi's default codebook init (usage 1, sums 0) makes every centroid zero and every code 0, so the
    codebooks get random unit-variance centroids (and usages in [0.5, 1.5), exercising the EMA division).
    """
    model = Qwen3TTSEncoder(config if isinstance(config, EncoderConfig) else EncoderConfig.from_dict(config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Conv1d):
                fan_in = module.in_channels * module.kernel_size[0]
                module.weight.normal_(0.0, math.sqrt(2.0 / fan_in), generator=gen)
                if module.bias is not None:
                    bound = 1.0 / math.sqrt(fan_in)
                    module.bias.uniform_(-bound, bound, generator=gen)
            elif isinstance(module, nn.Linear):
                module.weight.normal_(0.0, 0.02, generator=gen)
                if module.bias is not None:
                    module.bias.zero_()
        for cb in model.quantizer.codebooks():
            usage = torch.rand(cb.cluster_usage.shape, generator=gen) + 0.5
            centroids = torch.randn(cb.embed_sum.shape, generator=gen)
            cb.cluster_usage.copy_(usage)
            cb.embed_sum.copy_(centroids * usage[:, None])
    model = model.to(device=device, dtype=dtype).eval()
    _codebooks_to_fp32(model)
    return model


def read_encoder_config(tokenizer_dir: Path) -> EncoderConfig:
    path = tokenizer_dir / "config.json"
    top = read_json(path)
    raw = top.get("encoder_config")
    if raw is None:
        raise CheckpointError(f"{path} has no 'encoder_config'")
    valid = top.get("encoder_valid_num_quantizers", 16)
    rate = top.get("encode_downsample_rate", 1920)
    in_rate = top.get("input_sample_rate", MODEL_SAMPLE_RATE)
    for key, val in (("encoder_valid_num_quantizers", valid), ("encode_downsample_rate", rate)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise CheckpointError(f"{path}: {key} must be a positive integer, got {val!r}")
    cfg = EncoderConfig.from_dict(
        raw, valid_num_quantizers=valid, downsample_rate=rate, source=f"{path}: encoder_config"
    )
    if in_rate != cfg.sampling_rate:
        raise CheckpointError(
            f"{path}: input_sample_rate {in_rate} differs from "
            f"encoder_config.sampling_rate {cfg.sampling_rate}"
        )
    return cfg


def load_qwen3_tts_encoder(
    checkpoint_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> Qwen3TTSEncoder:
    """Load the encoder from a Qwen3-TTS model directory (reads ``speech_tokenizer/``) or from a bare
    speech-tokenizer directory. Every key must match; unused Mimi leftovers are dropped by exact name."""
    root = Path(checkpoint_dir)
    tokenizer_dir = root / "speech_tokenizer" if (root / "speech_tokenizer").is_dir() else root
    cfg = read_encoder_config(tokenizer_dir)
    weights = tokenizer_dir / "model.safetensors"
    state = read_prefixed_tensors(weights, "encoder.")
    if not state:
        raise CheckpointError(
            f"{weights} holds no 'encoder.*' tensors: not a Qwen3-TTS 12 Hz speech tokenizer"
        )
    model = Qwen3TTSEncoder(cfg)
    # Matched under the checkpoint's own prefix so any error names the full key as stored in the file.
    holder = nn.Module()
    holder.encoder = model
    load_state_dict_strict(
        holder, state, source=str(weights), ignore=unused_quantizer_keys(cfg, prefix="encoder.quantizer.")
    )
    model = model.to(device=device, dtype=dtype).eval()
    _codebooks_to_fp32(model)
    return model
