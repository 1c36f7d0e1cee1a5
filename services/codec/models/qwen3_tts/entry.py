"""What the codec stage asks of Qwen3-TTS (named by ``voxstage.families.qwen3_tts``): the loaded codec
runtime (decoder pool, reference encoder, and the speaker encoder of Base checkpoints), and the codec's
files of a preset directory (the speech tokenizer, and the speaker encoder of Base presets)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from services.codec.models import CodecRuntime
from voxstage.checkpoint import read_json
from voxstage.families import Preset
from voxstage.presets import ModelSource

from . import encoder as enc
from . import loader
from . import presets as codec_presets
from . import speaker_encoder as spk
from .config import Qwen3DecoderConfig
from .streaming import StreamingDecoder


def load_codec(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype, max_streams: int
) -> CodecRuntime:
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
        decoder_snapshots=True,  # the slot pool's state is all a stream carries (streaming.py)
    )


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_preset(preset: Preset, out: Path, seed: int) -> None:
    """After the talker's files: ``speech_tokenizer/`` (configs and, for the tiny preset, the decoder and
    encoder weights) and, for a Base preset, the speaker encoder (its config in ``config.json``, its weights
    beside the talker's in ``model.safetensors``, as the released checkpoints keep them)."""
    from safetensors.torch import load_file, save_file

    size, variant = preset.options["size"], preset.options["variant"]
    tiny = not preset.random_init
    st_config = codec_presets.speech_tokenizer_config(size)
    _write_json(out / "speech_tokenizer" / "config.json", st_config)
    _write_json(
        out / "speech_tokenizer" / "preprocessor_config.json",
        {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "sampling_rate": 24000,
         "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True},
    )  # fmt: skip
    if variant == "base":
        config = read_json(out / "config.json")
        hidden = config["talker_config"]["hidden_size"]
        spk_cfg = spk.tiny_speaker_encoder_config(hidden) if tiny else spk.real_speaker_encoder_config(hidden)
        _write_json(out / "config.json", {**config, "speaker_encoder_config": spk_cfg})
    if not tiny:
        return
    with torch.no_grad():
        if variant == "base":
            se = spk.random_init_speaker_encoder(spk_cfg, seed=seed + 1)
            weights = load_file(str(out / "model.safetensors"))
            weights |= {f"speaker_encoder.{k}": v.contiguous() for k, v in se.state_dict().items()}
            save_file(weights, str(out / "model.safetensors"))
        dec = loader.random_init(Qwen3DecoderConfig.from_dict(st_config["decoder_config"]), seed)
        encoder = enc.random_init_encoder(st_config["encoder_config"], seed=seed + 2)
        st = {f"decoder.{k}": v.contiguous() for k, v in dec.state_dict().items()}
        st |= {f"encoder.{k}": v.contiguous() for k, v in encoder.state_dict().items()}
        save_file(st, str(out / "speech_tokenizer" / "model.safetensors"))
