"""Encode side of the Mimi split residual vector quantizer (semantic RVQ + acoustic RVQ).

Both RVQs see the *same* 25->12.5 Hz latent, each through its own 1x1 input projection; the semantic RVQ
contributes the first code group and the acoustic RVQ the rest. Codebooks are stored in the EMA form
(``embed_sum`` / ``cluster_usage``); the centroid table is their ratio.
"""

from __future__ import annotations

import torch
from torch import nn

from .encoder_config import EncoderConfig

_USAGE_EPS = 1e-5  # Mimi's clamp on cluster_usage before dividing


class EuclideanCodebook(nn.Module):
    def __init__(self, codebook_size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("cluster_usage", torch.ones(codebook_size))
        self.register_buffer("embed_sum", torch.zeros(codebook_size, dim))

    @property
    def embed(self) -> torch.Tensor:
        # Recomputed per call (16 x 2048 x 256 divisions, negligible next to the encoder) rather than cached,
        # so weights copied in place by the loader can never leave a stale table behind.
        return self.embed_sum / self.cluster_usage.clamp(min=_USAGE_EPS)[:, None]

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[N, D]`` -> (nearest centroid index ``[N]``, that centroid ``[N, D]``)."""
        embed = self.embed.to(x.dtype)
        dists = torch.cdist(x[None], embed[None], p=2)[0]
        idx = dists.argmin(dim=-1)
        return idx, embed[idx]


class ResidualVectorQuantizer(nn.Module):
    def __init__(self, config: EncoderConfig, num_layers: int) -> None:
        super().__init__()
        self.input_proj = (
            nn.Conv1d(config.hidden_size, config.vq_hidden_size, 1, bias=False)
            if config.vq_hidden_size != config.hidden_size
            else None
        )
        self.layers = nn.ModuleList(
            _VectorQuantization(config.codebook_size, config.codebook_dim) for _ in range(num_layers)
        )

    def encode(self, latent: torch.Tensor) -> torch.Tensor:
        """``latent`` ``[B, hidden, T]`` -> codes ``[B, num_layers, T]`` (int64)."""
        x = self.input_proj(latent) if self.input_proj is not None else latent
        b, d, t = x.shape
        # The reference measures distances in fp32 whatever the activation dtype; we also keep the residual
        # chain in fp32 so half-precision activations lose nothing beyond the projection. At fp32 this is
        # the reference's arithmetic exactly, so codes match bit for bit; fp64 runs (tests) keep fp64.
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        residual = x.transpose(1, 2).reshape(b * t, d).to(work)
        codes = []
        for layer in self.layers:
            idx, quantized = layer.codebook.encode(residual)
            residual = residual - quantized
            codes.append(idx.view(b, t))
        return torch.stack(codes, dim=1)


class _VectorQuantization(nn.Module):
    # The extra level exists only so parameter names match the checkpoint (``layers.N.codebook.*``).
    def __init__(self, codebook_size: int, dim: int) -> None:
        super().__init__()
        self.codebook = EuclideanCodebook(codebook_size, dim)


class SplitResidualVectorQuantizer(nn.Module):
    """Only the quantizers the model uses are built: ``valid_num_quantizers`` in total (16 of 32 released)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.num_semantic = config.num_semantic_quantizers
        self.num_acoustic = config.valid_num_quantizers - config.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVectorQuantizer(config, self.num_semantic)
        self.acoustic_residual_vector_quantizer = ResidualVectorQuantizer(config, self.num_acoustic)

    def encode(self, latent: torch.Tensor) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(latent)
        if self.num_acoustic:
            codes = torch.cat([codes, self.acoustic_residual_vector_quantizer.encode(latent)], dim=1)
        return codes

    def codebooks(self) -> list[EuclideanCodebook]:
        rvqs = (self.semantic_residual_vector_quantizer, self.acoustic_residual_vector_quantizer)
        return [layer.codebook for rvq in rvqs for layer in rvq.layers]


def unused_quantizer_keys(config: EncoderConfig, prefix: str = "quantizer.") -> list[str]:
    """Checkpoint keys the encoder never reads: the output projections (decode side) and the codebooks of
    quantizers beyond ``valid_num_quantizers``, plus Mimi's ``initialized`` flags."""
    keys: list[str] = []
    num_sem = config.num_semantic_quantizers
    groups = (
        ("semantic_residual_vector_quantizer", num_sem, num_sem),
        (
            "acoustic_residual_vector_quantizer",
            config.num_quantizers - num_sem,
            config.valid_num_quantizers - num_sem,
        ),
    )
    for name, total, used in groups:
        keys.append(f"{prefix}{name}.output_proj.weight")
        for i in range(total):
            base = f"{prefix}{name}.layers.{i}.codebook."
            keys.append(base + "initialized")
            if i >= used:
                keys += [base + "cluster_usage", base + "embed_sum"]
    return keys
