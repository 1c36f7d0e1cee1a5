"""Qwen3-TTS (12 Hz tokenizer; 0.6B and 1.7B; CustomVoice, VoiceDesign and Base checkpoints): text to
speech, a talker LM with a code predictor and a 24 kHz, 16-codebook codec. What a checkpoint offers (its
speakers, languages, variant) comes from the checkpoint, reported by the talker's Status."""

from voxstage.families.descriptor import Bench, Family, Preset

_TALKER = "services.talker.models.qwen3_tts.entry"
_CODEC = "services.codec.models.qwen3_tts.entry"


def _preset(size: str, variant: str, suffix: str = "") -> Preset:
    tiny = size == "qwen3-tts-tiny"  # size-true ones draw their weights on the device
    return Preset(f"{size}{suffix}", random_init=not tiny, options={"size": size, "variant": variant})


FAMILY = Family(
    name="qwen3_tts",
    title="Qwen3-TTS",
    duplex=False,
    talker=f"{_TALKER}:load_talker",
    codec=f"{_CODEC}:load_codec",
    preset_writers=(f"{_TALKER}:write_preset", f"{_CODEC}:write_preset"),
    presets=(
        _preset("qwen3-tts-tiny", "custom_voice"),
        _preset("qwen3-tts-tiny", "base", "-base"),
        _preset("qwen3-tts-tiny", "voice_design", "-voice-design"),
        _preset("qwen3-tts-0.6b", "custom_voice"),
        _preset("qwen3-tts-0.6b", "base", "-base"),
        _preset("qwen3-tts-1.7b", "custom_voice"),
        _preset("qwen3-tts-1.7b", "base", "-base"),
        _preset("qwen3-tts-1.7b", "voice_design", "-voice-design"),
    ),
    model_types=("qwen3_tts",),
    sample_rate=24_000,
    frame_rate_hz=12.5,
    # Bounded ticks, earliest deadline first: on the stage links 64 gap-free 0.6B streams against fifo's 24
    # (H200, one session, 2026-12-03; docs/benchmarks.md).
    codec_tick_policy="deadline",
    # Paced at 3x real time with a 3 s cushion (held streams riding along): 128 gap-free 0.6B streams against
    # 96 unpaced, over gRPC and through the openai client alike, one H100 lease (docs/benchmarks.md,
    # twenty-first session); below pace_from_streams nothing changes.
    talker_pacing=(3.0, 3.0),
    # bf16 against the default fp32: 5.3 % relative RMS on size-true weights, +27 % codec throughput
    # (docs/models.md, "Codec precision"); the reference's own serving precision.
    codec_dtype_key="qwen3_tts_codec_dtype",
    languages=None,  # the checkpoint's codec_language_id
    # BCP-47 primary subtags for the language names the checkpoints use.
    language_tags={
        "en": "english", "de": "german", "es": "spanish", "zh": "chinese", "ja": "japanese", "fr": "french",
        "ko": "korean", "ru": "russian", "it": "italian", "pt": "portuguese",
    },
    # OpenAI's female voices to female speakers, the male ones to male speakers, English-speaking ones
    # where there are (every target is a CustomVoice speaker of the released checkpoints and the presets).
    voice_aliases={
        "alloy": "serena", "ash": "ryan", "ballad": "aiden", "cedar": "ryan", "coral": "vivian",
        "echo": "aiden", "fable": "ryan", "marin": "serena", "nova": "vivian", "onyx": "uncle_fu",
        "sage": "serena", "shimmer": "vivian", "verse": "aiden",
    },
    deploy_file="deploy/qwen3_tts.yaml",
    bench=Bench(
        "1,25",
        folder="bench/families/qwen3_tts",
        voice="ryan",
        language="english",
        engine_script="engine_gpu.py",
        reference_script="reference_qwen_tts.py",
        reference_export="export_reference_weights.py",
        kv_fp8="bench.families.qwen3_tts.kv_fp8",
        tag_prefix="qwen3-tts-",
        default_models=("qwen3-tts-0.6b", "qwen3-tts-1.7b"),
    ),
    demo=("qwen3-tts-tiny", "ryan"),
)  # fmt: skip
