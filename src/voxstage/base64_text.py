"""Base64 as clients send it: one decoder for every face (reference audio, voice recordings, realtime audio).

Line breaks and other ASCII whitespace are skipped, as RFC 2045 (MIME) writes base64 in 76-character lines and
``base64`` on the command line wraps at 76 by default; anything else outside the alphabet, or bad padding, is
refused rather than dropped, so a truncated or mangled payload never decodes to other audio.
"""

from __future__ import annotations

import binascii

_WHITESPACE = str.maketrans("", "", " \t\r\n\f\v")


def decode_base64_text(text: str) -> bytes:
    """The bytes ``text`` encodes; ValueError when it is not base64."""
    try:
        # Most text has no whitespace (every realtime audio event): strict decoding takes it as it is, and
        # what it refuses is what has whitespace to skip, or is not base64. Removing whitespace from 5 KB
        # that has none cost a third of decoding it.
        return binascii.a2b_base64(text, strict_mode=True)
    except ValueError:  # binascii.Error, or text that is not ASCII
        pass
    try:
        return binascii.a2b_base64(text.translate(_WHITESPACE).encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError("not valid base64") from exc
