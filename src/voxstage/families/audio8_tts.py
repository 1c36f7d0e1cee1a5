"""Audio8-TTS-Preview-0.6b: text to speech in the model's own voice or one cloned from reference audio and
its transcript; a slow + fast AR talker and a 44.1 kHz, 10-codebook codec. Its released checkpoint calls
itself ``arktts`` (config.json ``model_type``), accepted as another spelling of this family."""

from voxstage.families.descriptor import Bench, Family, Preset

_TALKER = "services.talker.models.audio8_tts.entry"
_CODEC = "services.codec.models.audio8_tts.entry"
_OPENAI_VOICES = (
    "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer",
    "verse",
)  # fmt: skip
OWN_VOICE = "default"  # the model's one voice (it has no preset speakers)

FAMILY = Family(
    name="audio8_tts",
    title="Audio8-TTS",
    duplex=False,
    talker=f"{_TALKER}:load_talker",
    codec=f"{_CODEC}:load_codec",
    preset_writers=(f"{_TALKER}:write_preset", f"{_CODEC}:write_preset"),
    presets=(Preset("audio8-tts-tiny"), Preset("audio8-tts-0.6b", random_init=True)),
    model_types=("arktts",),
    aliases=("arktts",),
    sample_rate=44_100,
    frame_rate_hz=44_100 / 2048,
    languages=(),  # it reads the text's language
    voice_aliases={name: OWN_VOICE for name in _OPENAI_VOICES},
    codec_dtype_key="audio8_tts_codec_dtype",
    # Whole ticks: its large fp32 decodes cut to a 20 ms budget served 16 gap-free streams against fifo's 24
    # (H200, one lease, 2026-12-03; docs/benchmarks.md).
    codec_tick_policy="fifo",
    deploy_file="deploy/audio8_tts.yaml",
    # No preset speakers, the text's own language; its reference is remote code only.
    bench=Bench("4,25", folder="bench/families/audio8_tts", engine_script="audio8_gpu.py"),
)
