"""How large a message the public faces accept, derived from the largest valid request (issue 26).

The public gRPC port accepted 64 MiB messages although no valid request exceeds about 10 MiB, and eight
concurrent 60 MB messages, all refused, took the gateway from 183 MB to over 1 GB of memory. A message is
now refused by the transport, before it is parsed, once it is larger than any valid request could be:

- the text to speak, the instructions and the reference transcript, each at most ``gateway.max_text_chars``
  characters of at most 4 UTF-8 bytes, and the reference clip (``limits.REFERENCE_BYTES``), or a duplex
  session's voice recording (``MAX_VOICE_BYTES``) with its persona;
- plus ``HEADROOM_BYTES`` for every other field and the framing.

HTTP carries the same request as JSON: the clip in base64 (4/3 of its bytes, more with line breaks) and
each text character as at most a 12-byte escape (``\\ud83d\\ude00``). A WebSocket frame may be a few times
the largest Realtime event, so that a slightly oversized event still gets its error event, while a huge
frame is closed by the protocol (1009) before it is buffered.
"""

from __future__ import annotations

import math

from gateway.duplex.settings import MAX_VOICE_BYTES
from voxstage import limits
from voxstage.duplex_audio import MAX_APPEND_BYTES, MAX_EVENT_BYTES

HEADROOM_BYTES = 64 * 1024
UTF8_MAX = 4  # bytes per character
JSON_ESCAPE_MAX = 12  # bytes per character: a surrogate pair as two \\uXXXX escapes
BASE64_LINE = 76  # RFC 2045 lines: 76 characters and a CRLF
TEXT_FIELDS = 3  # text, instructions, reference transcript (or a persona)


def grpc_max_receive_bytes(max_text_chars: int) -> int:
    """The largest ``voxstage.v1`` request message: a Synthesize with every text at its limit and the
    largest reference clip, or a Converse session update with the largest voice recording."""
    texts = TEXT_FIELDS * UTF8_MAX * max_text_chars
    clip = max(limits.REFERENCE_BYTES.end - 1, MAX_VOICE_BYTES, MAX_APPEND_BYTES)
    return texts + clip + HEADROOM_BYTES


def http_max_body_bytes(max_text_chars: int) -> int:
    """The largest ``POST /v1/audio/speech`` body: the same request as JSON, the clip in base64 lines."""
    encoded = 4 * math.ceil((limits.REFERENCE_BYTES.end - 1) / 3)
    wrapped = encoded + 2 * math.ceil(encoded / BASE64_LINE)
    return TEXT_FIELDS * JSON_ESCAPE_MAX * max_text_chars + wrapped + HEADROOM_BYTES


def ws_max_frame_bytes() -> int:
    """The largest WebSocket frame the Realtime face reads: four of its largest events."""
    return 4 * MAX_EVENT_BYTES
