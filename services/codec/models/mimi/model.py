"""Mimi codec (kyutai; the PersonaPlex/Moshi audio tokenizer): 24 kHz mono PCM <-> 8 x 2048 codes at 12.5 Hz.

Encode: SEANet encoder (-> 25 Hz latents) -> transformer -> learnt stride-2 conv (-> 12.5 Hz) -> split RVQ.
Decode: RVQ lookup -> learnt depthwise stride-2 transposed conv (-> 25 Hz) -> transformer -> SEANet decoder.

The module tree reproduces moshi's ``MimiModel`` names, so ``state_dict()`` keys are exactly those of
``tokenizer-e351c8d8-checkpoint125.safetensors``. Every stage is causal, which gives two ways to run it:

* offline (``encode`` / ``decode``): whole sequences from position 0, as moshi's non-streaming calls;
* one streaming step for a batch of streams (``encode_step`` / ``decode_step``), given each stream's saved
  histories (one flat row per stream, advanced in place) and absolute frame index; ``streaming.py`` keeps
  those rows in a slot pool.

The two directions have disjoint state (``encode_layout`` / ``decode_layout``), so a duplex session encodes
the user and decodes the agent on one model. See ``transformer.py`` for the attention-window
rule that makes streamed output equal moshi's frame-by-frame streaming at every chunking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.codec.checks import check_codes
from services.codec.slot_pool import collect_state_shapes, name_state_keys

from .config import MimiConfig
from .layers import Downsample, StreamConv1d, StreamConvTranspose1d, Upsample
from .quantizer import SplitResidualVQ
from .seanet import SEANetDecoder, SEANetEncoder
from .state import StateLayout, StreamContext
from .transformer import MimiAttention, ProjectedTransformer

_STATEFUL = (StreamConv1d, StreamConvTranspose1d, MimiAttention)
_ENCODE_SIDE = ("encoder", "encoder_transformer", "downsample")
_DECODE_SIDE = ("upsample", "decoder_transformer", "decoder")


class MimiModel(nn.Module):
    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.seanet.dimension
        stride = config.steps_per_frame
        self.encoder = SEANetEncoder(config.seanet)
        self.decoder = SEANetDecoder(config.seanet)
        self.encoder_transformer = ProjectedTransformer(config.transformer, stride)
        self.decoder_transformer = ProjectedTransformer(config.transformer, stride)
        self.quantizer = SplitResidualVQ(config.quantizer, config.num_codebooks)
        # moshi builds no resamplers when the encoder already runs at the frame rate.
        self.downsample = Downsample(dim, stride) if stride > 1 else None
        self.upsample = Upsample(dim, stride) if stride > 1 else None
        name_state_keys(self, _STATEFUL)
        self.encode_layout = StateLayout(self._state_shapes(_ENCODE_SIDE))
        self.decode_layout = StateLayout(self._state_shapes(_DECODE_SIDE))

    # -- geometry ----------------------------------------------------------------------------------
    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    @property
    def num_codebooks(self) -> int:
        return self.config.num_codebooks

    @property
    def codebook_size(self) -> int:
        return self.config.quantizer.bins

    @property
    def compute_dtype(self) -> torch.dtype:
        """Activation dtype of the convs and transformers (the quantizer stays fp32)."""
        return self.encoder.model[0].conv.conv.weight.dtype

    def encode_state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-stream shape of every history the encode direction carries, keyed by module path."""
        return self._state_shapes(_ENCODE_SIDE)

    def decode_state_shapes(self) -> dict[str, tuple[int, ...]]:
        return self._state_shapes(_DECODE_SIDE)

    def _state_shapes(self, sides: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
        return collect_state_shapes((getattr(self, side) for side in sides), _STATEFUL)

    # -- input checks (no device sync: value ranges are only checked on CPU tensors) ------------------
    def check_codes(self, codes: torch.Tensor) -> None:
        check_codes(codes, self.num_codebooks, self.codebook_size, min_frames=1)

    def check_pcm(self, pcm: torch.Tensor, whole_frames: bool) -> None:
        if pcm.dim() != 2 or pcm.shape[1] < 1:
            raise ValueError(f"pcm must be [batch, samples >= 1] (mono), got {tuple(pcm.shape)}")
        if not pcm.dtype.is_floating_point:
            raise ValueError(f"pcm must be a floating-point tensor, got {pcm.dtype}")
        spf = self.samples_per_frame
        if whole_frames and pcm.shape[1] % spf:
            raise ValueError(
                f"pcm must hold a whole number of {spf}-sample frames, got {pcm.shape[1]} samples"
            )

    # -- offline ----------------------------------------------------------------------------------
    def encode_latent(self, pcm: torch.Tensor, *, full_window: bool = False) -> torch.Tensor:
        """``[B, N]`` PCM -> unquantized 12.5 Hz latents ``[B, dim, ceil(N / spf)]`` (right-padded with zeros
        to whole frames, as moshi does). ``full_window``: moshi's offline attention window (see
        ``transformer.py``); the default is the frame-aligned window of its streaming pass."""
        self.check_pcm(pcm, whole_frames=False)
        pad = -pcm.shape[1] % self.samples_per_frame
        x = F.pad(pcm.to(self.compute_dtype), (0, pad))[:, None]
        return self._encode(x, None, full_window)

    def encode(self, pcm: torch.Tensor, *, full_window: bool = False) -> torch.Tensor:
        """``[B, N]`` PCM -> ``[B, num_codebooks, ceil(N / spf)]`` int64 codes."""
        return self.quantizer.encode(self.encode_latent(pcm, full_window=full_window))

    def decode(self, codes: torch.Tensor, *, full_window: bool = False) -> torch.Tensor:
        """``[B, num_codebooks, T]`` codes -> ``[B, T * spf]`` PCM (no clamp, as the reference)."""
        self.check_codes(codes)
        return self._decode(codes, None, full_window)

    # -- streaming steps ----------------------------------------------------------------------------
    def encode_step(
        self,
        pcm: torch.Tensor,
        state: torch.Tensor,
        start: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next T frames of B streams: ``pcm`` [B, T*spf] -> (codes [B, K, T], latents [B, dim, T]).

        ``state`` [B, encode_layout.width] holds each stream's histories (zeros for a fresh stream) and is
        advanced in place; it may be a view (a pool's first B rows). ``start`` [B] is each stream's absolute
        frame index (read only), ``lengths`` [B] how many of the T frames are real (``None``: all of them);
        padded frames give garbage outputs and never reach the state. No host syncs."""
        frames = pcm.shape[1] // self.samples_per_frame
        ctx = StreamContext(state, self.encode_layout, start, lengths, frames)
        latent = self._encode(pcm.to(self.compute_dtype)[:, None], ctx, False)
        return self.quantizer.encode(latent), latent

    def decode_step(
        self,
        codes: torch.Tensor,
        state: torch.Tensor,
        start: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``codes`` [B, K, T] -> PCM [B, T*spf]; ``state`` is [B, decode_layout.width], the rest as
        :meth:`encode_step`."""
        ctx = StreamContext(state, self.decode_layout, start, lengths, codes.shape[-1])
        return self._decode(codes, ctx, False)

    # -- shared pipelines ---------------------------------------------------------------------------
    def _encode(self, x: torch.Tensor, ctx: StreamContext | None, full_window: bool) -> torch.Tensor:
        h = self.encoder(x, ctx)
        h = self.encoder_transformer(h, ctx, full_window)
        if self.downsample is not None:
            h = self.downsample(h, ctx)
        return h

    def _decode(self, codes: torch.Tensor, ctx: StreamContext | None, full_window: bool) -> torch.Tensor:
        h = self.quantizer.decode(codes.long()).to(self.compute_dtype)
        if self.upsample is not None:
            h = self.upsample(h, ctx)
        h = self.decoder_transformer(h, ctx, full_window)
        return self.decoder(h, ctx).squeeze(1)
