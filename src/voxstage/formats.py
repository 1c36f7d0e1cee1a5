"""The one table of output audio formats, read by every face: HTTP ``response_format``, gRPC
``AudioEncoding``, the SDK's ``encoding=`` and ``voxstage say -o FILE`` (by its extension).

Nothing here encodes audio (``voxstage.audio`` does, through libsndfile for the compressed formats); this
module only says what exists, so it stays importable by the SDK without numpy or libsndfile. docs/api.md's
"Output formats" table is checked against ``FORMATS`` by tests/unit/gateway/test_formats_table.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from voxstage import limits
from voxstage.v1 import speech_pb2

# The sample rates each encoder accepts, where it does not take every rate of limits.SAMPLE_RATE.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # the rates Opus itself defines
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)  # MPEG-1/2/2.5 Layer III


@dataclass(frozen=True)
class OutputFormat:
    name: str  # HTTP response_format and SDK encoding
    encoding: int  # voxstage.v1.AudioEncoding
    content_type: str
    suffixes: tuple[str, ...]  # what `voxstage say -o` recognises, first one canonical
    streams: bool  # can be sent chunk by chunk as audio is made
    rates: tuple[int, ...] | None = None  # None: every rate in limits.SAMPLE_RATE
    fallback_rate: int | None = None  # used when the model's native rate is not in ``rates``
    note: str = ""
    # HTTP sends it whole unless the request says ``stream: true`` (a streamed WAV cannot state its sizes).
    whole_by_default: bool = False

    @property
    def encoding_name(self) -> str:
        return speech_pb2.AudioEncoding.Name(self.encoding)

    @property
    def streamed_by_default(self) -> bool:
        """Whether HTTP streams it when the request does not say (``stream`` unset)."""
        return self.streams and not self.whole_by_default

    def streams_text(self) -> str:
        """docs/api.md's "streams" column."""
        if not self.streams:
            return "no"
        return "with `stream: true`" if self.whole_by_default else "yes"

    def rates_text(self) -> str:
        if self.rates is None:
            return f"{limits.SAMPLE_RATE.low}–{limits.SAMPLE_RATE.end - 1} Hz"
        return ", ".join(str(r) for r in self.rates) + " Hz"


FORMATS: tuple[OutputFormat, ...] = (
    OutputFormat("pcm", speech_pb2.AUDIO_ENCODING_PCM_S16LE, "audio/pcm", (".pcm", ".raw"), True,
                 note="headerless signed 16-bit little-endian mono (OpenAI's pcm)"),
    OutputFormat("pcm_f32", speech_pb2.AUDIO_ENCODING_PCM_F32LE, "audio/pcm", (".f32",), True,
                 note="headerless 32-bit float little-endian mono"),
    OutputFormat("wav", speech_pb2.AUDIO_ENCODING_WAV, "audio/wav", (".wav",), True, whole_by_default=True,
                 note="16-bit; whole clips state their sizes, a streamed one 0xFFFFFFFF (unknown)"),
    OutputFormat("mulaw", speech_pb2.AUDIO_ENCODING_MULAW, "audio/basic", (".ulaw", ".mulaw"), True,
                 note="G.711 µ-law, 8 bits per sample"),
    OutputFormat("alaw", speech_pb2.AUDIO_ENCODING_ALAW, "audio/x-alaw-basic", (".alaw",), True,
                 note="G.711 A-law, 8 bits per sample"),
    OutputFormat("mp3", speech_pb2.AUDIO_ENCODING_MP3, "audio/mpeg", (".mp3",), True, MP3_RATES, 48_000,
                 note="constant bit rate (LAME via libsndfile)"),
    OutputFormat("opus", speech_pb2.AUDIO_ENCODING_OGG_OPUS, "audio/ogg", (".opus", ".ogg"), True, OPUS_RATES,
                 48_000, note="Ogg/Opus (libopus via libsndfile), 80 ms pages when streamed"),
    OutputFormat("flac", speech_pb2.AUDIO_ENCODING_FLAC, "audio/flac", (".flac",), False,
                 note="16-bit; whole clips only (a streamed FLAC header cannot state its length)"),
)  # fmt: skip

BY_NAME: dict[str, OutputFormat] = {f.name: f for f in FORMATS}
BY_ENCODING: dict[int, OutputFormat] = {f.encoding: f for f in FORMATS}
BY_SUFFIX: dict[str, OutputFormat] = {s: f for f in FORMATS for s in f.suffixes}
NAMES: tuple[str, ...] = tuple(BY_NAME)
STREAMING_NAMES: tuple[str, ...] = tuple(f.name for f in FORMATS if f.streams)


def encoding_name(value: int) -> str:
    """The enum name of an ``AudioEncoding`` number, or the number itself: enums are open in proto3, so a
    client may send a value no version of the proto names, and ``Name`` would raise on it."""
    values = speech_pb2.AudioEncoding.values()
    return speech_pb2.AudioEncoding.Name(value) if value in values else str(value)


def by_suffix(path: str) -> OutputFormat | None:
    """The format a file name asks for (``hello.mp3``), or None."""
    dot = path.rfind(".")
    return None if dot < 0 else BY_SUFFIX.get(path[dot:].lower())


def output_rate(fmt: OutputFormat, requested: int, native: int) -> int:
    """The rate audio is sent at: ``requested`` (0 = the model's ``native``). A native rate the encoder
    lacks is resampled to its ``fallback_rate``; a requested one it lacks is the caller's error (checked
    with ``rate_problem``)."""
    if requested:
        return requested
    if fmt.rates is not None and native not in fmt.rates and fmt.fallback_rate is not None:
        return fmt.fallback_rate
    return native


def rate_problem(fmt: OutputFormat, rate: int) -> str | None:
    if fmt.rates is None or rate in fmt.rates:
        return None
    return f"{fmt.name} supports {fmt.rates_text()}, not {rate}"
