"""The Audio8 codec (reference ``ArkttsCodec``): 10 codes per 2048-sample frame <-> 44.1 kHz mono PCM.

Module tree = the ``codec.pth`` key tree (models.md §2.5), weight norm folded:

* ``encoder.block``: causal conv 1->64 k7; 4 blocks (strides 2, 4, 8, 8; each ``block.0..2`` residual
  units at half width with dilation 1/3/9, ``block.3`` Snake, ``block.4`` strided causal conv k=2s doubling
  the width, and in the last block ``block.5`` a 4-layer window-512 transformer); Snake; conv 1024->1024 k3.
* ``quantizer``: see ``quantizer.py`` (codebooks, ``downsample``/``pre_module`` for encoding,
  ``post_module``/``upsample`` for decoding).
* ``decoder.model``: causal conv latent->1536 k7; 4 blocks (strides 8, 8, 4, 2: Snake, ConvTranspose k=2s
  right-cropped by k-s, residual units dil 1/3/9), halving the width each time (1536 -> 96); Snake; causal
  conv k7 -> 1; tanh.

Decode: ``codes_to_latent`` -> ``post_module`` -> ``upsample`` -> ``decoder.model``; F frames give exactly
F x 2048 samples, and everything is causal, so the same modules run the exact streaming step
(``forward_streaming``; the pool lives in ``streaming.py``). Codebook tables and projections stay fp32;
every other part runs in the model's compute dtype (fp32 by default, as vllm-omni serves it).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from services.codec.checks import check_codes
from services.codec.slot_pool import collect_state_shapes, name_state_keys
from services.codec.stream_layers import CausalConv1d, CausalConvTranspose1d, StreamContext, run_blocks

from .config import Audio8CodecConfig, TransformerGeometry
from .layers import DecoderBlock, ResidualUnit, Snake, Tanh
from .quantizer import Audio8Quantizer
from .reference_audio import prepare_reference
from .transformer import Attention, WindowTransformer, window_mask

_STATEFUL = (CausalConv1d, CausalConvTranspose1d, Attention)


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int, transformer: TransformerGeometry | None) -> None:
        super().__init__()
        half = dim // 2
        units: list[nn.Module] = [ResidualUnit(half, d) for d in (1, 3, 9)]
        units += [Snake(half), CausalConv1d(half, dim, 2 * stride, stride=stride)]
        if transformer is not None and transformer.layers:
            units.append(WindowTransformer(transformer))
        self.block = nn.ModuleList(units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_blocks(self.block, x, None)


class Audio8Encoder(nn.Module):
    def __init__(self, cfg: Audio8CodecConfig) -> None:
        super().__init__()
        blocks: list[nn.Module] = [CausalConv1d(1, cfg.encoder_channels, 7)]
        dim = cfg.encoder_channels
        last = len(cfg.encoder_strides) - 1
        for i, stride in enumerate(cfg.encoder_strides):
            dim *= 2
            blocks.append(EncoderBlock(dim, stride, cfg.encoder_transformer if i == last else None))
        blocks += [Snake(dim), CausalConv1d(dim, cfg.latent_dim, 3)]
        self.block = nn.ModuleList(blocks)

    def forward(self, pcm: torch.Tensor) -> torch.Tensor:
        """``[B, 1, S]`` -> ``[B, latent, S / 512]``."""
        x = pcm
        for block in self.block:
            x = block(x)
        return x


class Audio8Decoder(nn.Module):
    def __init__(self, cfg: Audio8CodecConfig) -> None:
        super().__init__()
        ch = cfg.decoder_channels
        stages: list[nn.Module] = [CausalConv1d(cfg.latent_dim, ch, 7)]
        for i, stride in enumerate(cfg.decoder_strides):
            stages.append(DecoderBlock(ch // 2**i, ch // 2 ** (i + 1), stride))
        out = ch // 2 ** len(cfg.decoder_strides)
        stages += [Snake(out), CausalConv1d(out, 1, 7), Tanh()]
        self.model = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        return run_blocks(self.model, x, ctx)


class Audio8Codec(nn.Module):
    """``forward(codes [B, 10, T]) -> wav [B, T * 2048]``;
    ``encode(pcm [B, S]) -> codes [B, 10, ceil(S / 2048)]``."""

    def __init__(self, config: Audio8CodecConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Audio8Encoder(config)
        self.quantizer = Audio8Quantizer(config)
        self.decoder = Audio8Decoder(config)
        name_state_keys(self, _STATEFUL)

    # -- geometry --------------------------------------------------------------------------------------
    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.decoder.model[0].conv.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.decoder.model[0].conv.weight.device

    def decode_modules(self) -> list[nn.Module]:
        """The parts a decode runs after the codebook lookup (the ones with streaming state)."""
        return [self.quantizer.post_module, self.quantizer.upsample, self.decoder]

    def stream_state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-stream shape of every decode-side history, keyed by module path (K/V as ``<path>.k/.v``)."""
        return collect_state_shapes(self.decode_modules(), _STATEFUL)

    def check_codes(self, codes: torch.Tensor) -> None:
        """Shape/dtype checks (no device sync). Values are checked only on the CPU: every codebook takes
        [0, 4096) (the talker's range; residual codes >= 1024 are clamped to 1023 by the decode)."""
        check_codes(codes, self.config.num_codebooks, self.config.semantic_codebook_size)

    # -- decode ------------------------------------------------------------------------------------------
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Offline single pass from frame 0 (causal zero padding, window-limited attention)."""
        self.check_codes(codes)
        pos = torch.arange(codes.shape[-1], device=codes.device)[None]
        return self._decode(codes, pos, window_mask(pos, pos, self.config.window), None)

    def forward_streaming(
        self,
        codes: torch.Tensor,
        state: dict[str, torch.Tensor],
        start: torch.Tensor,
        lengths: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The next T frames of B streams given their histories (``state``: ``[B, *shape]`` per key of
        :meth:`stream_state_shapes`, zeros for a fresh stream), absolute frame index ``start`` [B] and real
        frame counts ``lengths`` [B] (``None``: all T). Returns wav [B, T*2048] and the new histories.
        Shapes depend only on (B, T); nothing syncs with the host."""
        t = codes.shape[-1]
        history = self.config.window - 1
        q_pos = start[:, None] + torch.arange(t, device=codes.device)
        k_pos = start[:, None] - history + torch.arange(history + t, device=codes.device)
        ctx = StreamContext(state, lengths, t)
        wav = self._decode(codes, q_pos, window_mask(q_pos, k_pos, self.config.window), ctx)
        return wav, ctx.state_out

    def _decode(
        self, codes: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, ctx: StreamContext | None
    ) -> torch.Tensor:
        h = self.quantizer.codes_to_latent(codes.long()).to(self.compute_dtype)
        h = self.quantizer.post_module.step(h, positions, mask, ctx)
        for trans_conv, convnext in self.quantizer.upsample:
            h = convnext(trans_conv(h, ctx), ctx)
        return self.decoder(h, ctx).squeeze(1)

    # -- encode ------------------------------------------------------------------------------------------
    def num_frames(self, num_samples: int) -> int:
        """Frames ``encode`` gives for ``num_samples`` at 44.1 kHz: the clip is right-padded with zeros to
        a whole number of frames first (as the reference does), so ``ceil(S / 2048)``."""
        return math.ceil(num_samples / self.config.encoder_hop)

    @torch.inference_mode()
    def encode(self, pcm: torch.Tensor) -> torch.Tensor:
        """``pcm`` [B, S] (or [B, 1, S]) float at 44.1 kHz -> int64 codes [B, 10, ceil(S / 2048)]."""
        if pcm.dim() == 2:
            pcm = pcm[:, None]
        if pcm.dim() != 3 or pcm.shape[1] != 1 or pcm.shape[-1] == 0:
            raise ValueError(f"pcm must be [batch, samples] with samples >= 1, got {tuple(pcm.shape)}")
        hop = self.config.encoder_hop
        pad = self.num_frames(pcm.shape[-1]) * hop - pcm.shape[-1]
        x = F.pad(pcm.to(self.device, self.compute_dtype), (0, pad))
        return self.quantizer.encode_latent(self.encoder(x))

    def encode_reference(self, pcm: np.ndarray | torch.Tensor, sample_rate: int) -> torch.Tensor:
        """A voice-clone clip (float PCM, any rate, mono or [samples, channels]) -> int64 CPU ``[10, T]``."""
        wave = prepare_reference(pcm, sample_rate, self.config.sample_rate)
        return self.encode(wave[None]).squeeze(0).to("cpu", torch.int64)
