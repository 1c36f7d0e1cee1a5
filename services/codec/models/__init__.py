"""Model families of the codec stage, one folder each, behind one small runtime object.

``load_codec`` (text-to-speech families) and ``load_duplex_codec`` (duplex families) look the checkpoint's
family up in the registry (``voxstage.families``) and call the loader its descriptor names (each family's
``entry.py``). ``load_codec`` returns a ``CodecRuntime``: the streaming
decoder's slot pool (what ``CodecEngine`` drives), the reference-audio encoder and, for voice-clone (Base)
checkpoints, the speaker encoder, plus the geometry the stream protocol announces. ``load_duplex_codec``
returns a ``DuplexCodecRuntime``: one slot pool that encodes and decodes (what ``DuplexCodecEngine``
drives). Everything here runs on the codec's engine thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from voxstage.config import DeployConfig, check_codec_against_model, raise_for_errors
from voxstage.families import family, load_ref
from voxstage.presets import ModelSource

log = logging.getLogger(__name__)


class VoiceCloneUnsupported(ValueError):
    """Reference audio for a checkpoint that has no speaker encoder (not a Base model)."""


@dataclass
class CodecRuntime:
    family: str
    model: str
    # A StreamingCodec (``services.codec.engine``): slot pool of 2 x max_streams decoder states.
    decoder: Any
    encoder: torch.nn.Module
    speaker_encoder: torch.nn.Module | None
    num_groups: int
    codebook_size: int
    sample_rate: int
    samples_per_frame: int
    decoder_window_frames: int
    state_bytes_per_stream: int
    stateful: bool = True
    # The family clones a voice from the reference's codes and transcript alone (Audio8: they become prompt
    # frames), with no speaker encoder; the transcript is then required.
    clone_from_codes: bool = False
    # The decoder pool can copy a slot's streaming state out and put it back exactly (``snapshot`` /
    # ``restore``), so the engine may keep a voice-library voice's state after its reference prefix
    # (services/codec/voice_states.py) instead of decoding the prefix on every request.
    decoder_snapshots: bool = False

    @property
    def frame_rate_hz(self) -> float:
        return self.sample_rate / self.samples_per_frame

    @property
    def voice_clone(self) -> bool:
        return self.speaker_encoder is not None or self.clone_from_codes

    def encode_reference(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        """Reference clip (float PCM, any rate) -> int64 codes ``[frames, num_groups]``."""
        codes = self.encoder.encode_reference(pcm, sample_rate)  # type: ignore[operator]
        return np.ascontiguousarray(codes.numpy().T, dtype=np.int64)

    def speaker_embedding(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray | None:
        """Reference clip -> the talker's speaker embedding (x-vector), float32 ``[dim]``; None for a family
        that clones from codes alone."""
        if self.speaker_encoder is None:
            if self.clone_from_codes:
                return None
            raise VoiceCloneUnsupported(
                f"reference: {self.model} has no speaker encoder; voice cloning needs a Base checkpoint"
            )
        vec = self.speaker_encoder.embed_reference(pcm, sample_rate)  # type: ignore[operator]
        return np.ascontiguousarray(vec.numpy(), dtype=np.float32)


@dataclass
class DuplexCodecRuntime:
    family: str
    model: str
    # MimiStreamingCodec: ``max_sessions + 1`` slots of encode and decode state (the last one encodes voice
    # recordings).
    codec: Any
    num_groups: int
    codebook_size: int
    sample_rate: int
    samples_per_frame: int
    state_bytes_per_stream: int
    # A voice recording (mono float32, any rate) -> what the pool encodes: the family's rate and loudness,
    # whole frames (numpy only; the worker runs it on a helper thread).
    prepare_recording: Callable[[np.ndarray, int], np.ndarray]

    @property
    def frame_rate_hz(self) -> float:
        return self.sample_rate / self.samples_per_frame


def load_duplex_codec(
    source: ModelSource,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    max_sessions: int,
) -> DuplexCodecRuntime:
    """Load the audio codec of a duplex family with a pool for ``max_sessions`` sessions plus the
    voice-recording slot."""
    fam = family(source.family)
    if not fam.duplex:
        raise ValueError(f"codec: model family {source.family!r} has no duplex codec")
    loader = load_ref(fam.codec)
    runtime: DuplexCodecRuntime = loader(source, device=device, dtype=dtype, max_streams=max_sessions)
    return runtime


def load_codec(
    source: ModelSource,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    max_streams: int,
    config: DeployConfig | None = None,
) -> CodecRuntime:
    """Load the codec of ``source`` with a decoder pool for ``max_streams`` streams (2x slots: the upper
    half is the engine's scratch rows). With ``config``, the stream's chunk settings are checked against the
    loaded decoder (errors raise ``ConfigError``; warnings are logged)."""
    fam = family(source.family)
    if fam.duplex:
        raise ValueError(f"codec: model family {source.family!r} serves duplex sessions only")
    loader = load_ref(fam.codec)
    runtime: CodecRuntime = loader(source, device=device, dtype=dtype, max_streams=max_streams)
    if config is not None:
        issues = check_codec_against_model(
            config,
            decoder_window_frames=runtime.decoder_window_frames,
            stateful=runtime.stateful and not config.chunk_plan.overlap_crop,
            num_codebooks=runtime.num_groups,
        )
        for warning in raise_for_errors(issues):
            log.warning("%s", warning)
    return runtime
