"""Model families of the codec stage, one folder each, behind one small runtime object.

``load_codec`` (text-to-speech families) and ``load_duplex_codec`` (duplex families) are the only places the
codec stage looks at which family a checkpoint is. ``load_codec`` returns a ``CodecRuntime``: the streaming
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
    """Load the audio codec of a duplex family (PersonaPlex: Mimi from ``tokenizer-*.safetensors`` and
    ``mimi_config.json``) with a pool for ``max_sessions`` sessions plus the voice-recording slot."""
    if source.family != "personaplex":
        raise ValueError(f"codec: model family {source.family!r} has no duplex codec")
    from services.codec.models.mimi import loader
    from services.codec.models.mimi.presets import full_config
    from services.codec.models.mimi.recording import prepare_reference
    from services.codec.models.mimi.streaming import MimiStreamingCodec

    if source.random_init:
        # Size-true preset: the released architecture with weights drawn on the device, seeded as the tiny
        # preset's Mimi is (preset seed + 1), so every process of a deployment gets the same codec.
        model = loader.random_init(full_config(), source.seed + 1, device=device, dtype=dtype)
    else:
        model = loader.load_mimi(source.path, device=device, dtype=dtype)
    pool = MimiStreamingCodec(model, max_sessions + 1)
    return DuplexCodecRuntime(
        family="personaplex",
        model=source.name,
        codec=pool,
        num_groups=pool.num_codebooks,
        codebook_size=pool.codebook_size,
        sample_rate=pool.sample_rate,
        samples_per_frame=pool.samples_per_frame,
        state_bytes_per_stream=pool.state_bytes_per_stream(),
        prepare_recording=prepare_reference,
    )


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
    if source.family == "qwen3_tts":
        runtime = _load_qwen3_tts(source, device=device, dtype=dtype, max_streams=max_streams)
    elif source.family == "arktts":
        runtime = _load_audio8(source, device=device, dtype=dtype, max_streams=max_streams)
    else:
        raise ValueError(f"codec: model family {source.family!r} is not implemented")
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


def _load_qwen3_tts(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype, max_streams: int
) -> CodecRuntime:
    from services.codec.models.qwen3_tts import encoder as enc
    from services.codec.models.qwen3_tts import loader
    from services.codec.models.qwen3_tts import speaker_encoder as spk
    from services.codec.models.qwen3_tts.streaming import StreamingDecoder
    from voxstage.checkpoint import read_json

    top = read_json(source.path / "config.json")
    base = top.get("tts_model_type") == "base"
    speaker: torch.nn.Module | None = None
    if source.random_init:
        # Size-true presets: weights are drawn on the device with the seeds the preset builder uses, so
        # every process of a deployment gets the same random model.
        decoder = loader.random_init(
            loader.load_decoder_config(source.path), source.seed, device=device, dtype=dtype
        )
        tok_cfg = enc.read_encoder_config(source.path / "speech_tokenizer")
        encoder = enc.random_init_encoder(tok_cfg, seed=source.seed + 2, device=device, dtype=dtype)
        if base:
            speaker = spk.random_init_speaker_encoder(
                top["speaker_encoder_config"], seed=source.seed + 1, device=device, dtype=dtype
            )
    else:
        decoder = loader.load_qwen3_tts_decoder(source.path, device=device, dtype=dtype)
        encoder = enc.load_qwen3_tts_encoder(source.path, device=device, dtype=dtype)
        if base:
            speaker = spk.load_qwen3_tts_speaker_encoder(source.path, device=device, dtype=dtype)
    cfg = decoder.config
    pool = StreamingDecoder(decoder, 2 * max_streams)
    return CodecRuntime(
        family="qwen3_tts",
        model=source.name,
        decoder=pool,
        encoder=encoder,
        speaker_encoder=speaker,
        num_groups=cfg.num_quantizers,
        codebook_size=cfg.codebook_size,
        sample_rate=cfg.output_sample_rate,
        samples_per_frame=cfg.samples_per_frame,
        decoder_window_frames=cfg.sliding_window,
        state_bytes_per_stream=pool.state_bytes_per_stream(),
    )


def _load_audio8(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype, max_streams: int
) -> CodecRuntime:
    """Audio8-TTS (``arktts``): one ``codec.pth`` holds both halves, so the decoder pool and the
    reference-audio encoder share one model. Voice cloning needs only the reference codes (no speaker
    encoder). The talker samples every codebook over 4096 classes; the codec clamps residual codes."""
    from services.codec.models.audio8_tts import loader
    from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder
    from voxstage.checkpoint import read_json

    if source.random_init:
        # Size-true preset: config.json only; weights drawn on the device with the preset seed.
        config = loader.config_from_json(read_json(source.path / "config.json"))
        model = loader.random_init(config, source.seed, device=device, dtype=dtype)
    else:
        model = loader.load_audio8_codec(source.path, device=device, dtype=dtype)
    cfg = model.config
    pool = Audio8StreamingDecoder(model, 2 * max_streams)
    return CodecRuntime(
        family="arktts",
        model=source.name,
        decoder=pool,
        encoder=model,
        speaker_encoder=None,
        num_groups=cfg.num_codebooks,
        codebook_size=cfg.semantic_codebook_size,
        sample_rate=cfg.sample_rate,
        samples_per_frame=cfg.samples_per_frame,
        decoder_window_frames=cfg.window,
        state_bytes_per_stream=pool.state_bytes_per_stream(),
        clone_from_codes=True,  # the reference's codes and transcript become prompt frames (models.md §2.4)
    )
