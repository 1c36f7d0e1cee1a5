"""One rule for echoing a client's value in an error message: at most ``QUOTE_CHARS`` characters of it.

A refused value is quoted so that the client sees what was wrong, but a megabyte-long voice name must not
come back as a megabyte-long error: on gRPC the status message travels in the trailers, and an 8,000-character
name made them larger than the client's metadata limit, so the client saw RESOURCE_EXHAUSTED instead of the
real NOT_FOUND and retried it (issue 26). Every face and stage quotes request values through ``quoted``.
"""

from __future__ import annotations

QUOTE_CHARS = 64


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of a string (``str`` of anything else), cut to its first ``limit`` characters with the full
    length said after it: ``'vvvv...'... (9000 characters)``."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    head = repr(text[:limit]) if isinstance(value, str) else text[:limit]
    return f"{head}... ({len(text)} characters)"
