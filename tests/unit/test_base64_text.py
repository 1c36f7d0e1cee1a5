"""``decode_base64_text``: what it takes is what strict base64 takes once ASCII whitespace is skipped, and
everything else is a ValueError, whether its fast path (text without whitespace) or the general one ran."""

from __future__ import annotations

import base64
import binascii

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voxstage.base64_text import decode_base64_text

WHITESPACE = " \t\r\n\f\v"


def by_the_rule(text: str) -> bytes | None:
    """RFC 2045 as the module states it: ASCII whitespace skipped, then strict base64; None where refused."""
    kept = "".join(c for c in text if c not in WHITESPACE)
    try:
        return binascii.a2b_base64(kept.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError):
        return None


def decoded(text: str) -> bytes | None:
    try:
        return decode_base64_text(text)
    except ValueError:
        return None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", b""),
        ("AAE=", b"\x00\x01"),
        ("AA\r\nE=", b"\x00\x01"),
        (" AAE= \n", b"\x00\x01"),
        ("AAE", None),  # padding missing
        ("a=b", None),  # data after padding
        ("AA==AA==", None),
        ("AAE=é", None),  # not ASCII
        ("AA\u00a0E=", None),  # a non-ASCII space is not skipped
        ("AA-_", None),  # the URL-safe alphabet is another encoding
    ],
)
def test_examples(text: str, expected: bytes | None) -> None:
    assert decoded(text) == expected == by_the_rule(text)


base64ish = st.text(alphabet=st.sampled_from([*"AQgw+/=x", *WHITESPACE, "-", "é", "\x00"]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(text=base64ish)
def test_any_text_is_decoded_by_the_rule(text: str) -> None:
    assert decoded(text) == by_the_rule(text)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=64), wrap=st.integers(min_value=1, max_value=80))
def test_encoded_data_comes_back_wrapped_or_not(data: bytes, wrap: int) -> None:
    text = base64.b64encode(data).decode()
    lines = "\r\n".join(text[i : i + wrap] for i in range(0, len(text), wrap))
    assert decode_base64_text(text) == decode_base64_text(lines) == data
