"""The toy family's descriptor: all the system asks about it (see the package docstring)."""

from voxstage.families import Family, Preset

FAMILY = Family(
    name="toy_tts",
    title="Toy TTS",
    duplex=False,
    talker="tests.toy_family.talker:load_talker",
    codec="tests.toy_family.codec:load_codec",
    preset_writers=("tests.toy_family.talker:write_preset", "tests.toy_family.codec:write_preset"),
    presets=(Preset("toy-tts-tiny"),),
    model_types=("toy_tts",),
    sample_rate=16_000,
    frame_rate_hz=25.0,
    languages=(),
    voice_aliases={"alloy": "toy"},
    deploy_file="deploy/qwen3_tts.yaml",  # a text-to-speech deploy file; the model comes from --model
)
