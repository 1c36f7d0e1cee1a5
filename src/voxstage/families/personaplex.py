"""PersonaPlex (the 7B Moshi finetune): full-duplex speech to speech; a Helium + depformer talker and the
streaming Mimi codec (24 kHz, 8 codebooks). Its stored voices come from the checkpoint (``voices/``)."""

from voxstage.families.descriptor import Bench, Family, Limits, Preset

FAMILY = Family(
    name="personaplex",
    title="PersonaPlex",
    duplex=True,
    talker="services.talker.models.personaplex.entry:load_talker",
    codec="services.codec.models.mimi.entry:load_codec",
    preset_writers=(
        "services.talker.models.personaplex.entry:write_preset",
        "services.codec.models.mimi.entry:write_preset",
    ),
    presets=(Preset("personaplex-tiny"), Preset("personaplex-7b", random_init=True)),
    # moshi checkpoints say "moshi" or nothing at all (PersonaPlex ships an empty config.json): their
    # layout, a Mimi tokenizer-*.safetensors beside the LM, identifies them then.
    model_types=("moshi", "personaplex"),
    layout_glob="tokenizer-*.safetensors",
    sample_rate=24_000,
    frame_rate_hz=12.5,
    languages=(),
    voice_aliases={
        "alloy": "NATF0",
        "ash": "NATM0",
        "ballad": "NATM0",
        "cedar": "NATM0",
        "coral": "NATF0",
        "echo": "NATM0",
        "fable": "NATM0",
        "marin": "NATF0",
        "nova": "NATF0",
        "onyx": "NATM0",
        "sage": "NATF0",
        "shimmer": "NATF0",
        "verse": "NATM0",
    },  # fmt: skip
    limits=Limits(
        no_prefix_caching="its prompt ids are placeholders (voice and persona ride in per-request "
        "embeddings), so equal ids do not mean equal prefixes"
    ),
    deploy_file="deploy/personaplex.yaml",
    # Duplex sessions through /v1/realtime (bench/capacity_phases.py: the realtime and timeline phases).
    bench=Bench("1,5", voice="NATF0", engine_script="personaplex_gpu.py"),
)
