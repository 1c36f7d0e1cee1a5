"""The shape of a family descriptor: everything the rest of the system asks about one model family.

A family's descriptor module (``voxstage/families/<name>.py``, or any module named in ``VOXSTAGE_FAMILIES``)
defines ``FAMILY = Family(...)``. The stages' code is named by reference (``"module:attribute"``), never
imported here, so the shared floor stays free of stage code: a talker process imports the talker loader it
names, a codec process the codec loader, and building a preset imports the preset writers. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Preset:
    """A built-in model: materialized as a checkpoint directory in the family's real layout."""

    name: str
    # Weights are drawn on each stage's device at load (size-true presets for benchmarks); otherwise the
    # preset's seeded weights are written to disk (tiny, CPU-sized).
    random_init: bool = False
    # What the family's writers need to build it (e.g. Qwen3-TTS: its size and variant).
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    """Numeric facts that hold for every checkpoint of the family (per-checkpoint ones, such as the context
    length, come from the loaded checkpoint: ``TalkerInfo.max_positions``)."""

    # Why the talker must not cache prompt prefixes ("": it may, equal prompt ids meaning equal prefixes).
    no_prefix_caching: str = ""


@dataclass(frozen=True)
class Bench:
    """What ``bench/run_gpu.py`` runs a preset of this family with."""

    schedule: str  # "initial,steady" chunk frames of the deploy file
    voice: str = ""  # "" for a family without preset speakers
    language: str = ""  # "" for a family that reads the text's language
    # The family's bench folder (from the repository root): every benchmark that drives this family's own
    # code or its reference lives there, and only there may a bench tool name the family.
    folder: str = ""
    engine_script: str = ""  # the family's in-process engine benchmark, in `folder`
    # The reference implementation's benchmark, in `folder`, run in its own environment beside voxstage
    # (the RTF/TTFA baseline); "" when none can run here. `reference_export`, in `folder`, first writes the
    # preset's weights in the reference's checkpoint layout (--model, --out, --device).
    reference_script: str = ""
    reference_export: str = ""
    # The module (in `folder`) of ``bench/kv_fp8.py``'s drivers for a family with an fp8 KV cache ("": none;
    # bench/kv_fp8_kit.py says what it provides).
    kv_fp8: str = ""
    tag_prefix: str = ""  # dropped from a preset's name to make its result files' tag ("0.6b")
    default_models: tuple[str, ...] = ()  # the presets a run benchmarks when --models names none


@dataclass(frozen=True)
class Family:
    name: str  # the one code name: deploy files' `pipeline`, Status' family, folder names
    title: str  # how docs and logs name it
    duplex: bool  # serves full-duplex sessions (speech to speech) only, else text-to-speech only
    talker: str  # "module:function" (source, *, device, dtype) -> (adapter, TalkerInfo)
    codec: str  # "module:function" (source, *, device, dtype, max_streams) -> codec runtime
    # Builders of a preset directory, run in order on one directory: "module:function" (preset, dir, seed).
    preset_writers: tuple[str, ...] = ()
    presets: tuple[Preset, ...] = ()
    # How a checkpoint directory says it is this family: its config.json `model_type`, or (for layouts
    # whose config.json names none) a file that only this family's checkpoints carry.
    model_types: tuple[str, ...] = ()
    layout_glob: str | None = None
    aliases: tuple[str, ...] = ()  # other spellings accepted as `pipeline` (and from older stages)
    sample_rate: int = 24_000  # the codec's native output rate (Hz)
    frame_rate_hz: float = 12.5  # codec frames per second
    # Languages a request names besides "auto": None when the checkpoint lists them; () when the model
    # reads the text's language. `language_tags` maps BCP-47 primary subtags to the checkpoint's names.
    languages: tuple[str, ...] | None = ()
    language_tags: Mapping[str, str] = field(default_factory=dict)
    # OpenAI's voice names (alloy, ...) as aliases of this family's voices (gateway.voice_aliases).
    voice_aliases: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    # A deploy-file key under connectors.*.extra that only this family's codec reads: its compute dtype.
    codec_dtype_key: str | None = None
    # The codec's tick schedule on a GPU when the deploy file sets no `codec_tick_policy`: the one this
    # family's served closed search measured best (docs/benchmarks.md, docs/configuration.md).
    codec_tick_policy: Literal["fifo", "deadline"] = "fifo"
    # The talker's pacing under load on a GPU, (pace_realtime_x, pace_ahead_s), when the deploy file sets
    # neither key: the one this family's served closed searches measured best; None: unpaced.
    talker_pacing: tuple[float, float] | None = None
    deploy_file: str = ""  # the seed deploy file under deploy/
    bench: Bench | None = None
    # What `voxstage demo` runs when this family is the demo's: (preset, voice).
    demo: tuple[str, str] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling that means this family."""
        return (self.name, *self.aliases)

    def preset(self, name: str) -> Preset | None:
        return next((p for p in self.presets if p.name == name), None)
