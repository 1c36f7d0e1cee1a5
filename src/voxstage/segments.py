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


def sentence_cut(text: str) -> int:
    """Length of the longest prefix of ``text`` that ends a sentence (0: no complete sentence yet).

    The end must be followed by whitespace (or be CJK punctuation), so "3.5" is never cut and a delta that
    stops right after a period waits for the next one: "Hello." alone is not cut, "Hello. Next" is, after
    "Hello.". Abbreviations ("Mr. Smith") do cut; a client that needs better boundaries sends its own flushes.
    """
    cut = 0
    for m in _SENTENCE_END.finditer(text):
        cut = m.end()
    return cut
