"""Failures a stage reports to its downstream, independent of gRPC.

Engine-side code (which imports no ``grpc``) raises ``StageFailure`` with a status *name*; the servicers turn
it into an in-band ``StreamError`` with the matching gRPC status number. Keeping the names here lets both
sides agree without the engine modules importing the wire layer.
"""

from __future__ import annotations

# The gRPC status numbers docs/protocol.md §7 uses (google.rpc.Code).
CODES: dict[str, int] = {
    "CANCELLED": 1,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
}


class StageFailure(Exception):
    """A request-level failure: ``code`` is a status name from ``CODES``; ``message`` names the field."""

    def __init__(self, code: str, message: str) -> None:
        if code not in CODES:
            raise ValueError(f"unknown status name {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def number(self) -> int:
        return CODES[self.code]
