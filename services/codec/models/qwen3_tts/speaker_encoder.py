"""Qwen3-TTS speaker encoder (ECAPA-TDNN): 24 kHz reference audio -> x-vector of size = talker hidden.

Base checkpoints carry it as ``speaker_encoder.*`` in the main ``model.safetensors``; the x-vector takes the
speaker slot of the talker's codec prefix. Structure: TDNN -> SE-Res2Net blocks -> multi-layer feature
aggregation (concat of the SE-Res2Net outputs, TDNN) -> attentive statistics pooling -> 1x1 conv. Every
conv pads "same" by reflection, as the reference does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from voxstage.checkpoint import CheckpointError, load_state_dict_strict, read_json

from .checkpoint_io import read_prefixed_tensors
from .mel import SPEAKER_MEL, mel_spectrogram
from .reference_audio import DEFAULT_MAX_SECONDS, prepare_reference_audio

_DEFAULTS: dict[str, Any] = {  # Qwen3TTSSpeakerEncoderConfig defaults (qwen-tts 0.1.1)
    "mel_dim": 128,
    "enc_dim": 1024,
    "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 128,
    "enc_res2net_scale": 8,
    "enc_se_channels": 128,
    "sample_rate": 24_000,
}
_STATS_EPS = 1e-12


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int
    enc_dim: int
    enc_channels: tuple[int, ...]
    enc_kernel_sizes: tuple[int, ...]
    enc_dilations: tuple[int, ...]
    enc_attention_channels: int
    enc_res2net_scale: int
    enc_se_channels: int
    sample_rate: int

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], *, source: str = "speaker_encoder_config"
    ) -> SpeakerEncoderConfig:
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{source} must be a JSON object, got {type(raw).__name__}")
        v = {**_DEFAULTS, **{k: raw[k] for k in raw if k in _DEFAULTS}}

        def _int(key: str) -> int:
            val = v[key]
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise CheckpointError(f"{source}.{key} must be a positive integer, got {val!r}")
            return val

        def _ints(key: str) -> tuple[int, ...]:
            val = v[key]
            if (
                not isinstance(val, Sequence)
                or isinstance(val, str)
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in val)
            ):
                raise CheckpointError(f"{source}.{key} must be a list of positive integers, got {val!r}")
            return tuple(val)

        cfg = cls(
            mel_dim=_int("mel_dim"),
            enc_dim=_int("enc_dim"),
            enc_channels=_ints("enc_channels"),
            enc_kernel_sizes=_ints("enc_kernel_sizes"),
            enc_dilations=_ints("enc_dilations"),
            enc_attention_channels=_int("enc_attention_channels"),
            enc_res2net_scale=_int("enc_res2net_scale"),
            enc_se_channels=_int("enc_se_channels"),
            sample_rate=_int("sample_rate"),
        )
        cfg._check(source)
        return cfg

    def _check(self, source: str) -> None:
        ch, n = self.enc_channels, len(self.enc_channels)
        if not n == len(self.enc_kernel_sizes) == len(self.enc_dilations):
            raise CheckpointError(
                f"{source}: enc_channels, enc_kernel_sizes and enc_dilations differ in length"
            )
        if n < 3:
            raise CheckpointError(
                f"{source}.enc_channels needs >= 3 entries (TDNN, SE-Res2Net..., MFA), got {n}"
            )
        if self.mel_dim != SPEAKER_MEL.n_mels or self.sample_rate != SPEAKER_MEL.sample_rate:
            raise CheckpointError(
                f"{source}: mel_dim {self.mel_dim} / sample_rate {self.sample_rate} must be "
                f"{SPEAKER_MEL.n_mels} / {SPEAKER_MEL.sample_rate} (the reference's fixed mel front end)"
            )
        for i in range(1, n - 1):
            if ch[i] != ch[i - 1]:
                raise CheckpointError(
                    f"{source}.enc_channels[{i}] must equal enc_channels[{i - 1}] (residual connection)"
                )
            if ch[i] % self.enc_res2net_scale:
                raise CheckpointError(
                    f"{source}.enc_channels[{i}] ({ch[i]}) must be divisible by enc_res2net_scale"
                )
        if sum(ch[1:-1]) != ch[-1]:
            raise CheckpointError(
                f"{source}.enc_channels[-1] ({ch[-1]}) must equal the sum of the SE-Res2Net widths "
                f"({sum(ch[1:-1])}): the MFA conv takes their concatenation"
            )

    @property
    def min_frames(self) -> int:
        """Fewest mel frames every reflect-padded conv can take (padding must be shorter than the input)."""
        pairs = zip(self.enc_kernel_sizes, self.enc_dilations, strict=True)
        pads = [math.ceil(d * (k - 1) / 2) for k, d in pairs]
        return max(pads) + 1

    @property
    def min_samples(self) -> int:
        mel = SPEAKER_MEL
        return max(mel.min_samples, (self.min_frames - 1) * mel.hop_length + mel.n_fft - 2 * mel.pad)


def _conv(cin: int, cout: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNNBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    """Split channels into ``scale`` groups; group 0 passes through, group i>0 is convolved after adding
    the previous group's output, which widens the receptive field group by group."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(TDNNBlock(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outs = [parts[0]]
        prev: torch.Tensor | None = None
        for block, part in zip(self.blocks, parts[1:], strict=True):
            prev = block(part if prev is None else part + prev)
            outs.append(prev)
        return torch.cat(outs, dim=1)


class SEBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels, 1)
        self.conv2 = _conv(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(channels, channels, 1, 1)
        self.res2net_block = Res2NetBlock(channels, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(channels, channels, 1, 1)
        self.se_block = SEBlock(channels, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = (w * x).sum(dim=2)
    std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2).clamp(_STATS_EPS))
    return mean, std


class AttentiveStatsPool(nn.Module):
    """Per-channel attention over time conditioned on the utterance's global mean/std, returning the
    attention-weighted mean and std concatenated: ``[B, C, T] -> [B, 2C, 1]``."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        # Uniform weights 1/T (not x.mean) so the rounding matches the reference's masked statistics.
        uniform = torch.full((x.shape[0], 1, t), 1.0 / t, dtype=x.dtype, device=x.device)
        mean, std = _weighted_stats(x, uniform)
        stats = [mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)]
        context = torch.cat([x, *stats], dim=1)
        attn = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attn)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class Qwen3TTSSpeakerEncoder(nn.Module):
    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        self.config = config
        ch, ks, ds = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        blocks: list[nn.Module] = [TDNNBlock(config.mel_dim, ch[0], ks[0], ds[0])]
        blocks += [
            SERes2NetBlock(ch[i], config.enc_res2net_scale, config.enc_se_channels, ks[i], ds[i])
            for i in range(1, len(ch) - 1)
        ]
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], ds[-1])
        self.asp = AttentiveStatsPool(ch[-1], config.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, config.enc_dim, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """Log-mel ``[B, mel_dim, frames]`` -> x-vectors ``[B, enc_dim]``."""
        if mel.dim() != 3 or mel.shape[1] != self.config.mel_dim:
            raise ValueError(f"mel must be [batch, {self.config.mel_dim}, frames], got {tuple(mel.shape)}")
        if mel.shape[2] < self.config.min_frames:
            raise ValueError(
                f"mel has {mel.shape[2]} frames; the speaker encoder needs >= {self.config.min_frames}"
            )
        x = mel.to(self.fc.weight.dtype)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(2)

    @torch.inference_mode()
    def embed_reference(
        self, audio: np.ndarray | torch.Tensor, sample_rate: int, *, max_seconds: float = DEFAULT_MAX_SECONDS
    ) -> torch.Tensor:
        """One reference clip (any rate, ``[samples]`` or ``[samples, channels]`` float PCM) -> the x-vector
        ``[enc_dim]`` as a float32 CPU tensor."""
        wave = prepare_reference_audio(
            audio,
            sample_rate,
            max_seconds=max_seconds,
            min_samples=self.config.min_samples,
            target_rate=self.config.sample_rate,
        )
        mel = mel_spectrogram(wave[None].to(self.fc.weight.device))
        return self(mel)[0].float().cpu()


def _as_config(config: SpeakerEncoderConfig | Mapping[str, Any]) -> SpeakerEncoderConfig:
    return config if isinstance(config, SpeakerEncoderConfig) else SpeakerEncoderConfig.from_dict(config)


def random_init_speaker_encoder(
    config: SpeakerEncoderConfig | Mapping[str, Any],
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Qwen3TTSSpeakerEncoder:
    """Seeded random weights (He-normal convs, small uniform biases) for tests and benchmarks."""
    model = Qwen3TTSSpeakerEncoder(_as_config(config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Conv1d):
                fan_in = module.in_channels * module.kernel_size[0]
                module.weight.normal_(0.0, math.sqrt(2.0 / fan_in), generator=gen)
                if module.bias is not None:
                    module.bias.uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in), generator=gen)
    return model.to(device=device, dtype=dtype).eval()


def load_qwen3_tts_speaker_encoder(
    checkpoint_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> Qwen3TTSSpeakerEncoder:
    """Load ``speaker_encoder.*`` of a Base checkpoint; any other variant raises ``CheckpointError``."""
    root = Path(checkpoint_dir)
    path = root / "config.json"
    top = read_json(path)
    kind = top.get("tts_model_type")
    if kind is not None and kind != "base":
        raise CheckpointError(
            f"{root} is a '{kind}' checkpoint, which has no speaker encoder: voice clone from reference "
            "audio needs a Base checkpoint (tts_model_type 'base')"
        )
    weights = root / "model.safetensors"
    state = read_prefixed_tensors(weights, "speaker_encoder.")
    if not state:
        raise CheckpointError(
            f"{weights} has no 'speaker_encoder.*' tensors: voice clone from reference audio needs a Base "
            "checkpoint"
        )
    raw = top.get("speaker_encoder_config", {})
    cfg = SpeakerEncoderConfig.from_dict(raw, source=f"{path}: speaker_encoder_config")
    talker = top.get("talker_config")
    hidden = talker.get("hidden_size") if isinstance(talker, Mapping) else None
    if hidden is not None and hidden != cfg.enc_dim:
        raise CheckpointError(
            f"{path}: speaker_encoder_config.enc_dim ({cfg.enc_dim}) must equal talker_config.hidden_size "
            f"({hidden}): the x-vector is one talker input embedding"
        )
    model = Qwen3TTSSpeakerEncoder(cfg)
    holder = nn.Module()  # matched under the stored prefix so errors name keys as they appear in the file
    holder.speaker_encoder = model
    load_state_dict_strict(holder, state, source=str(weights))
    return model.to(device=device, dtype=dtype).eval()


def _config_dict(enc_dim: int, channels: list[int], attention: int, se: int) -> dict[str, Any]:
    return {
        **_DEFAULTS,
        "enc_dim": enc_dim,
        "enc_channels": channels,
        "enc_attention_channels": attention,
        "enc_se_channels": se,
    }


def real_speaker_encoder_config(enc_dim: int) -> dict[str, Any]:
    """``speaker_encoder_config`` of the released Base checkpoints (enc_dim = talker hidden)."""
    return _config_dict(enc_dim, [512, 512, 512, 512, 1536], 128, 128)


def tiny_speaker_encoder_config(enc_dim: int) -> dict[str, Any]:
    """Same structure (3 SE-Res2Net blocks, scale 8, same kernels/dilations) at 32 channels."""
    return _config_dict(enc_dim, [32, 32, 32, 32, 96], 16, 16)
