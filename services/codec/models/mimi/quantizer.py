"""Mimi's split residual vector quantizer: 1 semantic codebook + ``n_q - 1`` acoustic ones.

The two groups have their own 1x1 input/output projections (``quantizer.rvq_first`` and
``quantizer.rvq_rest``); encoding quantizes both from the same latent (the acoustic group does *not* see the
semantic residual), decoding sums both projected outputs. Only the first ``num_codebooks`` codebooks run
(8 for Moshi/PersonaPlex), but all ``n_q`` are in the checkpoint and load strictly.

Each codebook is stored as EMA statistics (``embedding_sum``, ``cluster_usage``, ``_initialized``; buffers,
as in the reference, so they are not counted as parameters). The vectors are
``embedding_sum / cluster_usage.clamp(min=1e-5)``; that division is done once, into the non-persistent
``codebooks`` table, whenever the statistics are loaded (``refresh_codebooks``), together with the codebook
half of the distance search (``search_tables``, see ``_nearest``). Keep this module in fp32:
nearest-neighbour search and the 8-way sum are precision-sensitive and the tables are small.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .config import QuantizerConfig

CODEBOOK_EPS = 1e-5  # moshi's EuclideanCodebook epsilon


class Codebook(nn.Module):
    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("_initialized", torch.zeros(1))
        self.register_buffer("cluster_usage", torch.ones(bins))
        self.register_buffer("embedding_sum", torch.zeros(bins, dim))

    def vectors(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=CODEBOOK_EPS)[:, None]


class _VQLayer(nn.Module):
    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(bins, dim)


class _VQStack(nn.Module):
    def __init__(self, n: int, bins: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQLayer(bins, dim) for _ in range(n))


class ResidualVQ(nn.Module):
    def __init__(self, n: int, cfg: QuantizerConfig) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(cfg.input_dimension, cfg.dimension, 1, bias=False)
        self.output_proj = nn.Conv1d(cfg.dimension, cfg.output_dimension, 1, bias=False)
        self.vq = _VQStack(n, cfg.bins, cfg.dimension)


class SplitResidualVQ(nn.Module):
    def __init__(self, cfg: QuantizerConfig, num_codebooks: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_codebooks = num_codebooks
        self.rvq_first = ResidualVQ(1, cfg)
        self.rvq_rest = ResidualVQ(cfg.n_q - 1, cfg)
        self.register_buffer(
            "codebooks", torch.zeros(num_codebooks, cfg.bins, cfg.dimension), persistent=False
        )
        # Per codebook [vectors | 1 | squared norms]: the operand torch.cdist rebuilds on every call.
        self.register_buffer(
            "search_tables", torch.zeros(num_codebooks, cfg.bins, cfg.dimension + 2), persistent=False
        )
        self.register_load_state_dict_post_hook(_refresh_after_load)

    def _used_layers(self) -> list[Codebook]:
        layers = [self.rvq_first.vq.layers[0]] + list(self.rvq_rest.vq.layers)
        return [layer._codebook for layer in layers[: self.num_codebooks]]

    @torch.no_grad()
    def refresh_codebooks(self) -> None:
        """Recompute the codebook vectors from the EMA statistics (after loading or drawing them)."""
        # copy_ rather than rebinding: captured CUDA graphs and views keep pointing at the same storage.
        self.codebooks.copy_(torch.stack([cb.vectors() for cb in self._used_layers()]))
        for k in range(self.num_codebooks):
            # One codebook at a time, shaped as torch.cdist sees it, so its norms round exactly as there.
            vectors = self.codebooks[k][None]
            norms = vectors.pow(2).sum(-1, keepdim=True)
            self.search_tables[k].copy_(torch.cat([vectors, torch.ones_like(norms), norms], dim=-1)[0])

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, K, T]`` codes -> ``[B, output_dimension, T]`` (fp32)."""
        k, bins = self.num_codebooks, self.cfg.bins
        # One lookup for all K codebooks: code c of codebook j is row j * bins + c of the stacked tables.
        offsets = torch.arange(0, k * bins, bins, device=codes.device)
        vectors = F.embedding(codes + offsets[:, None], self.codebooks.view(k * bins, -1))  # [B, K, T, D]
        out = self.rvq_first.output_proj(vectors[:, 0].transpose(1, 2))
        if k > 1:
            rest = vectors[:, 1:].sum(dim=1)
            out = out + self.rvq_rest.output_proj(rest.transpose(1, 2))
        return out

    def encode(self, latent: torch.Tensor) -> torch.Tensor:
        """``[B, input_dimension, T]`` latents -> ``[B, K, T]`` int64 codes (nearest codebook vector by L2,
        residual within the acoustic group)."""
        latent = latent.to(self.codebooks.dtype)
        b, _, t = latent.shape

        def rows(x: torch.Tensor) -> torch.Tensor:
            # [B, D, T] -> [B*T, D] once per group, the layout the distance search reads.
            return x.transpose(1, 2).reshape(b * t, -1)

        # The search operand of every codebook; its constant column is written once per call.
        operand = latent.new_empty(b * t, self.cfg.dimension + 2)
        operand[:, -1].fill_(1)
        codes = [self._nearest(rows(self.rvq_first.input_proj(latent)), 0, operand)]
        if self.num_codebooks > 1:
            residual = rows(self.rvq_rest.input_proj(latent))
            for k in range(1, self.num_codebooks):
                idx = self._nearest(residual, k, operand)
                codes.append(idx)
                if k + 1 < self.num_codebooks:
                    residual = residual - F.embedding(idx, self.codebooks[k])
        return torch.stack([c.view(b, t) for c in codes], dim=1)

    def _nearest(self, x: torch.Tensor, k: int, operand: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` -> ``[N]`` index of the closest vector of codebook ``k``, by the distances the
        reference's ``torch.cdist`` computes, bit for bit (and hence with its near-tie resolution): cdist's
        matrix-product form ``sqrt(max(0, [-2x | |x|^2 | 1] @ [c | 1 | |c|^2]^T))``, with the codebook
        operand precomputed. ``operand`` [N, D + 2] is scratch for the left operand; its last column holds
        ones already."""
        if x.shape[0] <= 25 and self.cfg.bins <= 25:  # where cdist itself takes its direct, non-matmul path
            return torch.cdist(x[None], self.codebooks[k][None], p=2.0)[0].argmin(dim=-1)
        d = x.shape[1]
        torch.mul(x, -2, out=operand[:, :d])
        torch.sum(x.pow(2), dim=-1, keepdim=True, out=operand[:, d : d + 1])
        dists = operand[None].matmul(self.search_tables[k][None].mT)[0]
        return dists.clamp_min_(0).sqrt_().argmin(dim=-1)


def _refresh_after_load(module: nn.Module, incompatible: Any) -> None:
    if isinstance(module, SplitResidualVQ):
        module.refresh_codebooks()
