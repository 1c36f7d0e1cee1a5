"""voxstage.segments: the text-derived frame cap and the sentence cuts of ``auto_flush: sentence``."""

from __future__ import annotations

import pytest

from voxstage.segments import FrameCap, SentenceFlusher, first_sentence_end


def test_the_cap_grows_with_the_text_and_weighs_wide_characters_more() -> None:
    cap = FrameCap(floor_s=3.0, s_per_char=0.15, s_per_wide_char=0.5)
    assert cap.seconds("") == 3.0
    assert cap.seconds("Hello there.") == pytest.approx(3.0 + 11 * 0.15)  # the blank is free
    assert cap.seconds("你好") == pytest.approx(3.0 + 2 * 0.5)
    assert cap.frames("Hello there.", 12.5) == 59  # ceil(4.65 s * 12.5 Hz)
    # Normal speech (about 14 Latin characters per second) never reaches the cap.
    sentence = "The quick brown fox jumps over the lazy dog near the river bank today."
    assert cap.seconds(sentence) > 2 * len(sentence) / 14


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("Hello.", 0),  # the next character decides: maybe "Hello.5"
        ("Hello. Next", 6),
        ("Pi is 3.5 or so", 0),
        ('He said "stop." Then', 15),  # a closing quote stays with its sentence
        ("... then", 0),  # punctuation alone is not a sentence
        ("好的。再见", 3),
        ("Wait?! Yes", 6),
    ],
)
def test_first_sentence_end(text: str, end: int) -> None:
    assert first_sentence_end(text) == end


def test_the_flusher_cuts_deltas_at_sentence_ends() -> None:
    f = SentenceFlusher()
    assert f.feed("Hello") == ["Hello"]
    assert f.feed(" there.") == [" there."]
    assert f.feed(" How") == [None, " How"]  # the cut is seen when the blank after the period arrives
    assert f.feed(" are you? I") == [" are you?", None, " I"]
    assert f.feed(" am fine. A. B") == [" am fine.", None, " A.", None, " B"]
    f.flushed()  # the client's own flush: nothing carries over
    assert f.feed(" ok.") == [" ok."]
    g = SentenceFlusher()
    pieces = [p for d in ("One. ", "Two. ", "Three") for p in g.feed(d)]
    assert pieces == ["One.", None, " ", "Two.", None, " ", "Three"]
