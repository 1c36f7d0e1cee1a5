"""Compressed audio (MP3, Ogg/Opus, FLAC) encoded by libsndfile (``soundfile``), chunk by chunk.

libsndfile writes through a file-like object; ``_Sink`` is one that remembers where each byte went, so the
bytes written since the last ``take()`` can leave at once (a streamed response) while the encoder may still
seek back and patch its header at close. Those patches only reach a whole clip (``finish()`` returns the
patched file); a stream has already sent its header, which is why the stream settings below are chosen so
that the unpatched header is still right:

* MP3 is constant bit rate: its first frame is LAME's Info-tag placeholder (a silent frame when left
  unpatched), and a decoder estimates a CBR stream's length from its size, where a VBR one would be misread.
* Ogg/Opus pages are flushed every ``OGG_PAGE_MS`` instead of libsndfile's default second, so audio leaves
  at the pace it is made.
* FLAC's header states the length only once it is known; streamed, it would say "unknown", which libsndfile
  itself cannot read back, so FLAC is whole-clip only (``voxstage.formats``).
"""

from __future__ import annotations

import io
import logging

import numpy as np
import soundfile as sf

log = logging.getLogger(__name__)

OGG_PAGE_MS = 80.0  # one 12.5 Hz codec frame: a page per frame the talker makes
MP3_QUALITY = 0.5  # libsndfile's compression level; for CBR, 0 is the top bit rate and 1 the lowest
_SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302  # sndfile.h; soundfile has no wrapper for it

# (container, subtype, extra SoundFile arguments) per voxstage format name.
_SETTINGS: dict[str, tuple[str, str, dict[str, object]]] = {
    "mp3": ("MP3", "MPEG_LAYER_III", {"bitrate_mode": "CONSTANT", "compression_level": MP3_QUALITY}),
    "opus": ("OGG", "OPUS", {}),
    "flac": ("FLAC", "PCM_16", {}),
}


class _Sink(io.RawIOBase):
    """A growable in-memory file that also tracks how much of it has been handed out."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.pos = 0
        self.taken = 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        chunk = bytes(b)
        end = self.pos + len(chunk)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
        self.data[self.pos : end] = chunk
        self.pos = end
        return len(chunk)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.data)}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else min(len(self.data), self.pos + size)
        out = bytes(self.data[self.pos : end])
        self.pos = max(self.pos, end)
        return out

    def take(self) -> bytes:
        out = bytes(self.data[self.taken :])
        self.taken = len(self.data)
        return out


class SndfileEncoder:
    """``encode(pcm)`` returns the bytes ready so far; ``close()`` the rest; ``finish()`` the whole file."""

    def __init__(self, name: str, sample_rate: int) -> None:
        container, subtype, extra = _SETTINGS[name]
        self._sink = _Sink()
        self._file = sf.SoundFile(
            self._sink, "w", samplerate=sample_rate, channels=1, format=container, subtype=subtype,
            **extra,  # type: ignore[arg-type]
        )  # fmt: skip
        if container == "OGG":
            _set_page_latency(self._file, OGG_PAGE_MS)

    def encode(self, pcm: np.ndarray) -> bytes:
        if pcm.size:
            self._file.write(np.clip(pcm, -1.0, 1.0).astype(np.float32, copy=False))
        return self._sink.take()

    def close(self) -> bytes:
        """The stream's last bytes (what the encoder still held, and the final page or frame)."""
        if not self._file.closed:
            self._file.close()
        return self._sink.take()

    def finish(self) -> bytes:
        """The whole file, with the header the encoder patched at close (for a whole clip)."""
        self.close()
        return bytes(self._sink.data)


def _set_page_latency(f: sf.SoundFile, ms: float) -> None:
    # Through soundfile's private cffi handle: the command exists in every libsndfile with Ogg/Opus (1.0.29+).
    # Should it fail, pages come about once a second: slower first audio, still a valid stream.
    try:
        value = sf._ffi.new("double*", ms)
        if sf._snd.sf_command(f._file, _SFC_SET_OGG_PAGE_LATENCY_MS, value, sf._ffi.sizeof("double")):
            log.debug("libsndfile refused an Ogg page latency of %g ms", ms)
    except AttributeError:
        log.debug("soundfile has no handle for sf_command; Ogg pages keep libsndfile's latency")
