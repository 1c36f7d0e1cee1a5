"""Segment rules shared by the gateway, the talker and the docs: the text-derived frame cap and sentence ends.

A streaming request's text is cut into segments by ``flush`` (and by the final half-close, and, with
``auto_flush: sentence``, by the gateway at sentence ends). Each segment is spoken as its own take.

**Frame cap.** A model that never emits end-of-speech (a tiny random model always, a real one now and
then) would speak until ``max_tokens``: minutes of audio for a short sentence. Each segment therefore gets a
cap on its audio length proportional to its text. Normal speech runs about 14 Latin characters per second
and 3-5 CJK characters per second; the default rates allow roughly twice the slowest of these plus a floor,
so real speech never meets the cap while a runaway ends within seconds. A request's explicit
``max_frames`` replaces the cap; the deploy file can change the rates (``segments:`` of the talker stage).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

# Sentence ends for auto_flush: terminal punctuation (Latin, CJK full-width) followed by whitespace or the end
# of the buffered text, so "3.5" or "e.g." inside a word does not cut. Closing quotes/brackets stay with the
# sentence.
_SENTENCE_END = re.compile(r"[.!?;…]+[\"'”’)\]]*(?=\s)|[。！？；]+[”’」』）]*")


@dataclass(frozen=True)
class FrameCap:
    """Seconds of audio a segment may take: ``floor_s`` plus a rate per character (blanks are free)."""

    floor_s: float = 3.0
    s_per_char: float = 0.15
    s_per_wide_char: float = 0.5  # East Asian wide/full-width characters: one syllable each

    def seconds(self, text: str) -> float:
        narrow = wide = 0
        for ch in text:
            if ch.isspace():
                continue
            if unicodedata.east_asian_width(ch) in ("W", "F"):
                wide += 1
            else:
                narrow += 1
        return self.floor_s + narrow * self.s_per_char + wide * self.s_per_wide_char

    def frames(self, text: str, frame_rate_hz: float) -> int:
        return max(1, math.ceil(self.seconds(text) * frame_rate_hz))


def first_sentence_end(text: str) -> int:
    """Length of the first complete sentence of ``text`` that has words in it (0: none yet).

    The end must be followed by whitespace (or be CJK punctuation), so "3.5" is never cut and a delta that
    stops right after a period waits for the next one: "Hello." alone is not cut, "Hello. Next" is, after
    "Hello.". Abbreviations ("Mr. Smith") do cut; a client that needs better boundaries sends its own flushes.
    """
    for m in _SENTENCE_END.finditer(text):
        if text[: m.end()].strip(" \t\n.!?;…。！？；\"'”’)]」』）"):
            return m.end()
    return 0


class SentenceFlusher:
    """``auto_flush: sentence``: cuts a stream of text deltas into segments at sentence ends.

    ``feed`` returns the delta's text in pieces with ``None`` where a flush belongs, so a delta that holds
    the end of one sentence and the start of the next ("done. Next") is split around its flush. A cut is
    only seen once the character after the punctuation arrives (``first_sentence_end``), so it may fall
    right at the start of a delta: the flush then goes before the delta's text.
    """

    def __init__(self) -> None:
        self._text = ""  # the current segment's text so far

    def feed(self, delta: str) -> list[str | None]:
        out: list[str | None] = []
        while True:
            text = self._text + delta
            first = first_sentence_end(text)
            if not first:
                break
            split = max(first - len(self._text), 0)  # the cut may fall in text already sent
            if delta[:split]:
                out.append(delta[:split])
            out.append(None)
            delta, self._text = delta[split:], ""
        if delta:
            out.append(delta)
        self._text += delta
        return out

    def flushed(self) -> None:
        """The client flushed: the next text starts a new segment."""
        self._text = ""
