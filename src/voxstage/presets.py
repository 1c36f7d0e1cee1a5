"""Where a stage's model comes from: a real checkpoint directory or a built-in random-weight preset.

Presets are materialized as checkpoint directories in the **real on-disk layout**, so every stage loads
them through the same loader as a released checkpoint. Tiny presets carry seeded random weights on disk
(tens of MB); size-true presets (0.6B / 1.7B) carry only their config and tokenizer files and are marked
``random_init`` so each stage draws its weights directly on its device (benchmarks: real FLOPs and bytes,
no multi-GB files).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from voxstage.checkpoint import CheckpointError, read_json

# name -> (size preset, Qwen3-TTS variant)
QWEN3_TTS_PRESETS: dict[str, tuple[str, str]] = {
    "qwen3-tts-tiny": ("qwen3-tts-tiny", "custom_voice"),
    "qwen3-tts-tiny-base": ("qwen3-tts-tiny", "base"),
    "qwen3-tts-tiny-voice-design": ("qwen3-tts-tiny", "voice_design"),
    "qwen3-tts-0.6b": ("qwen3-tts-0.6b", "custom_voice"),
    "qwen3-tts-0.6b-base": ("qwen3-tts-0.6b", "base"),
    "qwen3-tts-1.7b": ("qwen3-tts-1.7b", "custom_voice"),
    "qwen3-tts-1.7b-base": ("qwen3-tts-1.7b", "base"),
    "qwen3-tts-1.7b-voice-design": ("qwen3-tts-1.7b", "voice_design"),
}
PERSONAPLEX_PRESETS: tuple[str, ...] = ("personaplex-tiny", "personaplex-7b")
AUDIO8_PRESETS: tuple[str, ...] = ("audio8-tts-tiny", "audio8-tts-0.6b")
# config.json model_type -> family folder. moshi checkpoints say "moshi" or nothing at all (PersonaPlex ships
# an empty config.json): their layout, a Mimi ``tokenizer-*.safetensors`` beside the LM, identifies them.
FAMILIES = {
    "qwen3_tts": "qwen3_tts",
    "moshi": "personaplex",
    "personaplex": "personaplex",
    "arktts": "arktts",
}
PRESET_MARKER = "voxstage_preset.json"
PRESET_SEED = 0


@dataclass(frozen=True)
class ModelSource:
    name: str  # what the user asked for (preset name or directory)
    path: Path
    family: str
    random_init: bool = False  # weights are drawn at load time (size-true presets)
    seed: int = PRESET_SEED


def cache_dir() -> Path:
    base = os.environ.get("VOXSTAGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "voxstage")
    return Path(base)


def resolve_model(spec: str, *, cache: Path | None = None) -> ModelSource:
    """Turn ``--model`` (a checkpoint directory or a preset name) into a loadable source."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelSource(spec, path, _family_of(path))
    if spec in QWEN3_TTS_PRESETS:
        out = (cache or cache_dir()) / "presets" / spec
        marker = out / PRESET_MARKER
        if not marker.is_file():
            _materialize_qwen3_tts(spec, out)
        info = read_json(marker)
        return ModelSource(spec, out, "qwen3_tts", random_init=bool(info["random_init"]), seed=PRESET_SEED)
    if spec in PERSONAPLEX_PRESETS:
        out = (cache or cache_dir()) / "presets" / spec
        if not (out / PRESET_MARKER).is_file():
            _materialize_personaplex(spec, out)
        info = read_json(out / PRESET_MARKER)
        return ModelSource(spec, out, "personaplex", random_init=bool(info["random_init"]), seed=PRESET_SEED)
    if spec in AUDIO8_PRESETS:
        out = (cache or cache_dir()) / "presets" / spec
        if not (out / PRESET_MARKER).is_file():
            _materialize_audio8(spec, out)
        info = read_json(out / PRESET_MARKER)
        return ModelSource(spec, out, "arktts", random_init=bool(info["random_init"]), seed=PRESET_SEED)
    known = ", ".join((*QWEN3_TTS_PRESETS, *PERSONAPLEX_PRESETS, *AUDIO8_PRESETS))
    raise CheckpointError(f"model: {spec!r} is neither a checkpoint directory nor a preset ({known})")


def _family_of(path: Path) -> str:
    config = path / "config.json"
    moshi_layout = any(path.glob("tokenizer-*.safetensors"))
    if moshi_layout and (not config.is_file() or "model_type" not in read_json(config)):
        return "personaplex"
    model_type = read_json(config).get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{path / 'config.json'}: model_type {model_type!r} is not served by voxstage "
            f"(supported: {', '.join(FAMILIES)})"
        )
    return FAMILIES[str(model_type)]


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _publish(tmp: Path, out: Path) -> None:
    """Move a finished preset directory into place; a concurrent builder's identical copy may win."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(out)
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / PRESET_MARKER).is_file():
            raise


def _materialize_personaplex(name: str, out: Path) -> None:
    """The released directory layout: ``config.json`` (moshi kwargs; ``{}`` for the 7B, as shipped),
    ``model.safetensors``, the SentencePiece tokenizer, ``voices/`` and Mimi's ``tokenizer-*.safetensors`` +
    ``mimi_config.json``. Only the tiny preset carries weights; the 7B draws them on its device at load."""
    import torch

    from services.codec.models.mimi.loader import random_init as random_mimi
    from services.codec.models.mimi.loader import write_mimi_checkpoint
    from services.codec.models.mimi.presets import tiny_config
    from services.talker.models.personaplex.config import parse_lm_config
    from services.talker.models.personaplex.loader import random_init, save_checkpoint
    from services.talker.models.personaplex.presets import PRESET_VOICES, preset_config, voice_codes
    from services.talker.models.personaplex.tokenizer import tiny_tokenizer_model
    from services.talker.models.personaplex.voices import voice_from_codes

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    lm_kwargs = preset_config(name)
    tiny = name == "personaplex-tiny"
    tmp.mkdir(parents=True, exist_ok=True)
    if tiny:
        with torch.no_grad():
            model = random_init(parse_lm_config(lm_kwargs, source=name), seed=PRESET_SEED)
            voices = {v: voice_from_codes(model, voice_codes(v)) for v in PRESET_VOICES}
            save_checkpoint(tmp, model, lm_kwargs, tokenizer_model=tiny_tokenizer_model(), voices=voices)
            write_mimi_checkpoint(
                random_mimi(tiny_config(), seed=PRESET_SEED + 1), tmp, "tokenizer-tiny.safetensors"
            )
    else:
        _write_json(tmp / "config.json", lm_kwargs)
    _write_json(tmp / PRESET_MARKER, {"preset": name, "random_init": not tiny, "seed": PRESET_SEED})
    _publish(tmp, out)


def _materialize_audio8(name: str, out: Path) -> None:
    """The released layout: one flat ``config.json`` (talker fields and the ``codec_*`` fields both stages
    read), ``generation_config.json``, ``tokenizer.json``, and for the tiny preset ``model.safetensors`` and
    ``codec.pth`` (seeded). The 0.6B draws its weights on each stage's device at load."""
    from services.codec.models.audio8_tts.presets import codec_config_fields, codec_preset, write_tiny_codec
    from services.talker.models.audio8_tts.presets import write_preset

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    random_init = write_preset(name, tmp, seed=PRESET_SEED)
    # The talker writes the released codec fields; a preset's codec geometry (tiny: 2 post layers) wins.
    config = read_json(tmp / "config.json")
    _write_json(tmp / "config.json", {**config, **codec_config_fields(codec_preset(name))})
    if not random_init:
        write_tiny_codec(tmp, seed=PRESET_SEED + 1)
    _write_json(tmp / PRESET_MARKER, {"preset": name, "random_init": random_init, "seed": PRESET_SEED})
    _publish(tmp, out)


def _materialize_qwen3_tts(name: str, out: Path) -> None:
    # Imported here: building a preset is the only place shared code needs both stages' model code.
    import torch
    from safetensors.torch import save_file

    from services.codec.models.qwen3_tts import encoder as enc
    from services.codec.models.qwen3_tts import loader as codec_loader
    from services.codec.models.qwen3_tts import presets as codec_presets
    from services.codec.models.qwen3_tts import speaker_encoder as spk
    from services.codec.models.qwen3_tts.config import Qwen3DecoderConfig
    from services.talker.models.qwen3_tts import presets as talker_presets
    from services.talker.models.qwen3_tts.config import parse_config
    from services.talker.models.qwen3_tts.loader import random_init, talker_checkpoint_state
    from services.talker.models.qwen3_tts.tokenizer import write_tiny_tokenizer

    size, variant = QWEN3_TTS_PRESETS[name]
    tiny = size == "qwen3-tts-tiny"
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    config = talker_presets.preset_config(size, variant)  # type: ignore[arg-type]
    hidden = config["talker_config"]["hidden_size"]
    if variant == "base":
        spk_cfg = spk.tiny_speaker_encoder_config(hidden) if tiny else spk.real_speaker_encoder_config(hidden)
        config["speaker_encoder_config"] = spk_cfg
    generation = talker_presets.preset_generation_config()
    st_config = codec_presets.speech_tokenizer_config(size)
    _write_json(tmp / "config.json", config)
    _write_json(tmp / "generation_config.json", generation)
    _write_json(tmp / "speech_tokenizer" / "config.json", st_config)
    _write_json(
        tmp / "speech_tokenizer" / "preprocessor_config.json",
        {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "sampling_rate": 24000,
         "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True},
    )  # fmt: skip
    # The tiny byte-level BPE stands in for Qwen's 151k vocabulary at every size: benchmarks feed token ids
    # whose count, not identity, sets the cost.
    write_tiny_tokenizer(tmp)
    if tiny:
        with torch.no_grad():
            talker = random_init(parse_config(config, generation, source=name), seed=PRESET_SEED)
            weights = talker_checkpoint_state(talker)
            if variant == "base":
                se = spk.random_init_speaker_encoder(config["speaker_encoder_config"], seed=PRESET_SEED + 1)
                weights |= {f"speaker_encoder.{k}": v.contiguous() for k, v in se.state_dict().items()}
            save_file(weights, str(tmp / "model.safetensors"))
            dec = codec_loader.random_init(
                Qwen3DecoderConfig.from_dict(st_config["decoder_config"]), PRESET_SEED
            )
            encoder = enc.random_init_encoder(st_config["encoder_config"], seed=PRESET_SEED + 2)
            st = {f"decoder.{k}": v.contiguous() for k, v in dec.state_dict().items()}
            st |= {f"encoder.{k}": v.contiguous() for k, v in encoder.state_dict().items()}
            save_file(st, str(tmp / "speech_tokenizer" / "model.safetensors"))
    _write_json(tmp / PRESET_MARKER, {"preset": name, "random_init": not tiny, "seed": PRESET_SEED})
    _publish(tmp, out)
