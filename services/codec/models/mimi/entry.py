"""What the codec stage asks of PersonaPlex's codec, Mimi (named by ``voxstage.families.personaplex``): the
loaded duplex runtime (one pool that encodes and decodes), and the codec's part of a preset directory."""

from __future__ import annotations

from pathlib import Path

import torch

from services.codec.models import DuplexCodecRuntime
from voxstage.families import Preset
from voxstage.presets import ModelSource

from . import loader
from .presets import full_config, tiny_config
from .recording import prepare_reference
from .streaming import MimiStreamingCodec


def load_codec(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype, max_streams: int
) -> DuplexCodecRuntime:
    """Mimi from ``tokenizer-*.safetensors`` and ``mimi_config.json``, with a pool for ``max_streams``
    sessions plus the voice-recording slot."""
    if source.random_init:
        # Size-true preset: the released architecture with weights drawn on the device, seeded as the tiny
        # preset's Mimi is (preset seed + 1), so every process of a deployment gets the same codec.
        model = loader.random_init(full_config(), source.seed + 1, device=device, dtype=dtype)
    else:
        model = loader.load_mimi(source.path, device=device, dtype=dtype)
    pool = MimiStreamingCodec(model, max_streams + 1)
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


def write_preset(preset: Preset, out: Path, seed: int) -> None:
    """After the talker's files: the tiny preset's seeded Mimi (``tokenizer-tiny.safetensors`` and
    ``mimi_config.json``); the 7B's is drawn on its device at load."""
    if not preset.random_init:
        with torch.no_grad():
            loader.write_mimi_checkpoint(
                loader.random_init(tiny_config(), seed=seed + 1), out, "tokenizer-tiny.safetensors"
            )
