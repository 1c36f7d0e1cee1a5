"""The codec's ``quantizer`` subtree: codebooks, the frame-rate transformers and the 4x re-samplers.

``quantizer.semantic_quantizer.quantizers.0`` (4096 x 8) and ``quantizer.quantizer.quantizers.0..8``
(1024 x 8) are DAC-style vector quantizers: ``in_proj`` (latent -> 8) and ``out_proj`` (8 -> latent) are
1x1 convs (weight ``[out, in, 1]``; legacy weight norm in the checkpoint, folded at load), ``codebook`` an
``nn.Embedding``. Decoding sums ``out_proj(codebook[code])`` over the 10 codebooks (semantic term first, then
the residual terms in order); residual codes are clamped to ``[0, 1023]`` and semantic ones to ``[0, 4095]``
first, as the reference does, because the talker samples every codebook over 4096 classes.

Encoding (reference audio only): ``downsample`` (2x [causal conv k2 s2, ConvNeXt]) -> ``pre_module`` ->
semantic code = cosine nearest neighbour of ``in_proj(z)`` -> residual RVQ on ``z - semantic vector``.
``post_module`` and ``upsample`` (2x [ConvTranspose k2 s2, ConvNeXt]) belong to the decode path and stream.

Assumptions where models.md is silent (each consistent with the structure of vllm-omni's port, which
claims strict loading of ``codec.pth``): in/out projections are 1x1 ``Conv1d`` with bias (DAC's form); the
residual codebooks use the same cosine lookup as the semantic one (``config.residual_cosine``); the
re-sampler convs carry no weight norm (after folding it makes no difference to loading).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.codec.stream_layers import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock

from .config import Audio8CodecConfig
from .transformer import WindowTransformer


class VectorQuantizer(nn.Module):
    def __init__(self, latent: int, size: int, dim: int, cosine: bool) -> None:
        super().__init__()
        self.size = size
        self.cosine = cosine
        self.in_proj = nn.Conv1d(latent, dim, 1)
        self.out_proj = nn.Conv1d(dim, latent, 1)
        self.codebook = nn.Embedding(size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` codes (already in range) -> ``[B, latent, T]``."""
        return self.out_proj(F.embedding(codes, self.codebook.weight).transpose(1, 2))

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``z`` [B, latent, T] -> (codes [B, T], quantized [B, latent, T])."""
        projected = self.in_proj(z).transpose(1, 2)  # [B, T, dim]
        table = self.codebook.weight
        if self.cosine:
            projected, table = F.normalize(projected, dim=-1), F.normalize(table, dim=-1)
        # The reference's squared distance, term for term (the constant |x|^2 included, so near-ties round
        # the same way).
        distance = projected.pow(2).sum(-1, keepdim=True) - 2 * projected @ table.t() + table.pow(2).sum(-1)
        codes = distance.argmin(-1)
        return codes, self.decode(codes)


class ResidualQuantizer(nn.Module):
    def __init__(self, n: int, latent: int, size: int, dim: int, cosine: bool) -> None:
        super().__init__()
        self.size = size
        self.quantizers = nn.ModuleList(VectorQuantizer(latent, size, dim, cosine) for _ in range(n))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, n, T]`` -> ``[B, latent, T]`` (clamped into the codebook, summed in codebook order)."""
        codes = codes.clamp(0, self.size - 1)
        total = self.quantizers[0].decode(codes[:, 0])
        for i in range(1, len(self.quantizers)):
            total = total + self.quantizers[i].decode(codes[:, i])
        return total

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual VQ of ``z`` [B, latent, T] -> (codes [B, n, T], sum of quantized vectors)."""
        residual, total, codes = z, torch.zeros_like(z), []
        for quantizer in self.quantizers:
            code, vec = quantizer.quantize(residual)
            codes.append(code)
            total = total + vec
            residual = residual - vec
        return torch.stack(codes, dim=1), total


class Audio8Quantizer(nn.Module):
    def __init__(self, cfg: Audio8CodecConfig) -> None:
        super().__init__()
        latent = cfg.latent_dim
        self.semantic_quantizer = ResidualQuantizer(
            1, latent, cfg.semantic_codebook_size, cfg.codebook_dim, cosine=True
        )
        self.quantizer = ResidualQuantizer(
            cfg.num_residual, latent, cfg.residual_codebook_size, cfg.codebook_dim, cfg.residual_cosine
        )
        self.downsample = nn.ModuleList(
            nn.ModuleList([CausalConv1d(latent, latent, f, stride=f), ConvNeXtBlock(latent)])
            for f in cfg.resample_factors
        )
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(latent, latent, f, f), ConvNeXtBlock(latent)])
            for f in reversed(cfg.resample_factors)
        )
        self.pre_module = WindowTransformer(cfg.pre)
        self.post_module = WindowTransformer(cfg.post)

    def codes_to_latent(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, 10, T]`` codes -> summed codebook vectors ``[B, latent, T]`` (fp32, before post_module)."""
        return self.semantic_quantizer.decode(codes[:, :1]) + self.quantizer.decode(codes[:, 1:])

    def encode_latent(self, z: torch.Tensor) -> torch.Tensor:
        """Encoder output ``[B, latent, 4T]`` -> codes ``[B, 10, T]``."""
        for conv, convnext in self.downsample:
            z = convnext(conv(z))
        z = self.pre_module(z).float()
        semantic_codes, semantic = self.semantic_quantizer.quantize(z)
        residual_codes, _ = self.quantizer.quantize(z - semantic)
        return torch.cat([semantic_codes, residual_codes], dim=1)
