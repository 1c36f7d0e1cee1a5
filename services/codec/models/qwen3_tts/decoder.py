"""Qwen3-TTS 12 Hz tokenizer decoder (code2wav): 16 RVQ codes per 80 ms frame -> 1920 PCM samples at 24 kHz.

The module tree reproduces the ``decoder.*`` names of ``speech_tokenizer/model.safetensors`` exactly, so a
real checkpoint loads strictly. Pipeline (models.md §1.6): split RVQ lookup -> causal conv k3 -> 8-layer
sliding-window transformer -> 2x (ConvTranspose + causal ConvNeXt) -> causal conv k7 -> 4 SnakeBeta
upsampling blocks -> SnakeBeta + causal conv k7 -> clamp(-1, 1). Everything is causal, so the same modules
also run the exact streaming step (see ``streaming.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.codec.checks import check_codes
from services.codec.slot_pool import collect_state_shapes, name_state_keys
from services.codec.stream_layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    StreamContext,
    prenorm_layers_fused,
    window_mask,
)
from voxstage.nn import fused
from voxstage.nn.layers import RMSNorm, rope_cos_sin, rope_inv_freq

from .config import Qwen3DecoderConfig
from .layers import DecoderBlock, SnakeBeta, TransformerLayer, WindowAttention

_STATEFUL = (CausalConv1d, CausalConvTranspose1d, WindowAttention)


class EuclideanCodebook(nn.Module):
    """EMA codebook as trained: the entry is ``embedding_sum / max(cluster_usage, eps)``."""

    def __init__(self, size: int, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` codes -> ``[B, T, dim]``; gathering before dividing touches T rows instead of all
        ``size`` and is bit-identical to dividing the whole table first."""
        usage = F.embedding(codes, self.cluster_usage[:, None]).clamp(min=self.eps)
        return F.embedding(codes, self.embedding_sum) / usage


class _VQLayer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQLayer(size, dim) for _ in range(n))


class ResidualVQ(nn.Module):
    """One RVQ group: summed codebook vectors, then a 1x1 ``output_proj`` back to ``codebook_dim``.

    ``input_proj`` only serves encoding, but the checkpoint carries it, so it is part of the tree.
    """

    def __init__(self, n: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _VQStack(n, size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, n, T]`` -> ``[B, io_dim, T]``."""
        total = self.vq.layers[0]._codebook.decode(codes[:, 0])
        for i in range(1, len(self.vq.layers)):
            total = total + self.vq.layers[i]._codebook.decode(codes[:, i])
        return self.output_proj(total.transpose(1, 2))


class SplitResidualVQ(nn.Module):
    """Group 0 (semantic) and groups 1.. (acoustic) have separate projections; their outputs add."""

    def __init__(self, cfg: Qwen3DecoderConfig) -> None:
        super().__init__()
        dim = cfg.codebook_vector_dim
        self.rvq_first = ResidualVQ(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualVQ(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)
        self._table: tuple[tuple[object, ...], torch.Tensor] | None = None

    def codebooks(self) -> list[EuclideanCodebook]:
        return [layer._codebook for rvq in (self.rvq_first, self.rvq_rest) for layer in rvq.vq.layers]

    def table(self) -> torch.Tensor | None:
        """Every codebook's entries, divided, stacked ``[Q * size, dim]`` (code c of codebook j is row
        ``j * size + c``), kept per weight version; None where the weights carry no version (inference
        tensors) and so no safe cache key. Dividing the table once gives the same values as dividing the
        gathered rows (``EuclideanCodebook.decode``)."""
        books = self.codebooks()
        try:
            key = tuple(
                (p._version, p.data_ptr(), p.dtype) for b in books for p in (b.embedding_sum, b.cluster_usage)
            )
        except RuntimeError:
            return None
        if self._table is not None and self._table[0] == key:
            return self._table[1]
        with torch.no_grad():
            table = torch.cat([b.embedding_sum / b.cluster_usage[:, None].clamp(min=b.eps) for b in books])
        # A table first built inside a graph capture holds values only once that graph replays: not kept.
        if table.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            self._table = (key, table)
        return table

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, Q, T]`` -> ``[B, codebook_dim, T]``. One lookup for all Q codebooks instead of ~5 launches
        per codebook (about 80 of a streaming decode's kernels); the acoustic vectors summed in codebook
        order."""
        table = self.table()
        if table is None:
            return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])
        q, size = codes.shape[1], self.rvq_first.vq.layers[0]._codebook.embedding_sum.shape[0]
        offsets = torch.arange(0, q * size, size, device=codes.device)
        vectors = F.embedding(codes + offsets[:, None], table)  # [B, Q, T, dim]
        first = self.rvq_first.output_proj(vectors[:, 0].transpose(1, 2))
        return first + self.rvq_rest.output_proj(vectors[:, 1:].sum(dim=1).transpose(1, 2))


class DecoderTransformer(nn.Module):
    """``input_proj`` latent->hidden, pre-norm layers, final RMSNorm, ``output_proj`` hidden->latent."""

    def __init__(self, cfg: Qwen3DecoderConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        # A plain attribute, not a buffer: .to(bf16) would round it and move every angle away from the
        # reference's fp32 table. Kept per device so a decode does not rebuild it (3 kernels a call).
        table = self._inv_freq.get(device)
        if table is None:
            table = self._inv_freq[device] = rope_inv_freq(self.head_dim, self.rope_theta, device=device)
        return table

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        """``x`` [B, T, latent]; ``positions`` [B|1, T] absolute frame indices; ``mask`` [B|1, 1, T, Tk]."""
        h = self.input_proj(x)
        cos, sin = rope_cos_sin(positions, self.inv_freq(h.device), h.dtype)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        if fused.kernels_active(h):
            parts = [layer.fused_parts(cos, sin, mask, ctx) for layer in self.layers]
            return self.output_proj(prenorm_layers_fused(h, parts, self.norm))
        for layer in self.layers:
            h = layer(h, cos, sin, mask, ctx)
        return self.output_proj(self.norm(h))


class Qwen3TokenizerDecoder(nn.Module):
    """The 12 Hz code2wav decoder; ``forward(codes [B, Q, T]) -> wav [B, T * samples_per_frame]``."""

    def __init__(self, config: Qwen3DecoderConfig) -> None:
        super().__init__()
        self.config = config
        cfg = config
        self.quantizer = SplitResidualVQ(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = DecoderTransformer(cfg)
        latent = cfg.latent_dim
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(latent, latent, r, r), ConvNeXtBlock(latent)])
            for r in cfg.upsampling_ratios
        )
        stages: list[nn.Module] = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            stages.append(DecoderBlock(cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1), rate))
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        stages += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(stages)
        name_state_keys(self, _STATEFUL)

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    @property
    def compute_dtype(self) -> torch.dtype:
        """Activation dtype (the quantizer may be kept in fp32; everything after it runs in this)."""
        return self.pre_conv.conv.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.pre_conv.conv.weight.device

    def check_codes(self, codes: torch.Tensor) -> None:
        """Shape/dtype checks (no device sync); the value range only on the CPU (``codec.checks``)."""
        check_codes(codes, self.config.num_quantizers, self.config.codebook_size)

    def stream_state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-stream shape of every streaming history tensor, keyed by module path."""
        return collect_state_shapes([self], _STATEFUL)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Offline single pass from position 0 (zero left padding, window-limited causal attention)."""
        self.check_codes(codes)
        t = codes.shape[-1]
        pos = torch.arange(t, device=codes.device)[None]
        mask = window_mask(pos, pos, self.config.sliding_window)
        return self._run(codes, pos, mask, None)

    def forward_streaming(
        self,
        codes: torch.Tensor,
        state: dict[str, torch.Tensor],
        start: torch.Tensor,
        lengths: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One streaming step for B streams: the next T frames of each, given their history.

        ``state`` holds ``[B, *shape]`` for every key of :meth:`stream_state_shapes` (zeros for a fresh
        stream); ``start`` [B] is each stream's absolute frame index, ``lengths`` [B] how many of the T
        frames are real (the rest is right padding whose output is garbage and whose effect on the state
        is discarded; ``None``: all T). Returns the waveform [B, T*spf] and the new state. No host syncs.
        """
        t = codes.shape[-1]
        steps = torch.arange(t, device=codes.device)
        q_pos = start[:, None] + steps
        window = self.config.sliding_window
        k_pos = start[:, None] - (window - 1) + torch.arange(window - 1 + t, device=codes.device)
        mask = window_mask(q_pos, k_pos, window)
        ctx = StreamContext(state, lengths, t)
        wav = self._run(codes, q_pos, mask, ctx)
        return wav, ctx.state_out

    def _run(
        self, codes: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, ctx: StreamContext | None
    ) -> torch.Tensor:
        h = self.quantizer.decode(codes.long()).to(self.compute_dtype)
        h = self.pre_conv(h, ctx)
        h = self.pre_transformer(h.transpose(1, 2), positions, mask, ctx).transpose(1, 2)
        for trans_conv, convnext in self.upsample:
            h = convnext(trans_conv(h, ctx), ctx)
        for stage in self.decoder:
            h = stage(h, ctx)
        return h.clamp(-1.0, 1.0).squeeze(1)
