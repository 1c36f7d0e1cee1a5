"""The packed form of one ``LinkBatch`` (docs/protocol.md §12): per-request messages of one tick as records.

A batch is one little-endian record array (``ITEM``, one record per item, in send order) and one body slab
holding every item's bytes. Hot data is never a protobuf object on the wire: a ``credit``, a ``frames`` /
``user_codes`` (``CodecFrames``) and a ``pcm`` / ``user_audio`` (``PcmChunk``) with an inline payload are
records whose scalar fields are columns and whose codes, PCM, text tokens and transcript are (offset, length)
spans of the body. Anything else (open, opened, segment_done, end_of_stream, cancel, text, ...) is a
``MESSAGE`` record whose span holds that one per-request message, serialized. ``HALF_CLOSE``, ``RESET`` and
``END`` are the link's own per-request signals: the caller's half-close, the caller's cancel of its call, and
the end of the stage's handler (``count`` holds the status code, the span its details).

Which oneof arm of which message class is which kind depends on the direction and the service (``Schema``).
Imports no grpc.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from voxstage.internal.v1 import stage_pb2 as S

MESSAGE, CREDIT, FRAMES, PCM, HALF_CLOSE, RESET, END = 1, 2, 3, 4, 5, 6, 7
KIND_NAMES = {
    MESSAGE: "message",
    CREDIT: "credit",
    FRAMES: "frames",
    PCM: "pcm",
    HALF_CLOSE: "half_close",
    RESET: "reset",
    END: "end",
}

ITEM = np.dtype(
    [
        ("request", "<u4"),  # the link-local request number (the caller numbers its requests from 1)
        ("kind", "u1"),
        ("format", "u1"),  # PCM: PcmFormat; CREDIT: CreditUnit
        ("num_groups", "<u2"),  # FRAMES
        ("segment_index", "<u4"),  # FRAMES, PCM
        ("count", "<u4"),  # FRAMES: frame_count; PCM: sample_count; END: the handler's status code
        ("first", "<i8"),  # FRAMES: first_frame; PCM: sample_offset; CREDIT: amount
        ("first_frame", "<i8"),  # PCM
        ("user_frame", "<i8"),  # FRAMES, PCM
        ("sent_unix_ns", "<i8"),  # FRAMES, PCM
        ("frame_count", "<u4"),  # PCM
        ("timeout_ms", "<u4"),  # a request's first item: the caller's deadline from now (0: none)
        ("data", "<u8", (2,)),  # (offset, length) in the body: codes, PCM, a MESSAGE, END's details
        ("tokens", "<u8", (2,)),  # FRAMES: text_tokens
        ("text", "<u8", (2,)),  # FRAMES, PCM: transcript_delta (UTF-8)
    ]
)
_NO_SPAN = (0, 0)


@dataclass(frozen=True)
class Schema:
    """One direction of one service: its per-request message class, the name of its oneof, and which arm
    carries ``CodecFrames`` and which ``PcmChunk`` (None: this direction has none)."""

    message: Any
    oneof: str
    frames: str | None
    pcm: str | None
    envelope: Any  # the Link message of this direction, around its ``LinkBatch`` (``.batch``)


CODEC_REQUESTS = Schema(S.CodecStreamRequest, "request", None, "user_audio", S.CodecLinkRequest)
CODEC_RESPONSES = Schema(S.CodecStreamResponse, "response", None, "pcm", S.CodecLinkResponse)
TALKER_REQUESTS = Schema(S.TalkerStreamRequest, "request", "user_codes", None, S.TalkerLinkRequest)
TALKER_RESPONSES = Schema(S.TalkerStreamResponse, "response", "frames", None, S.TalkerLinkResponse)


# The most body bytes one batch starts with: what a writer that fell behind has queued goes out in several
# batches of at most about this size, well under gRPC's default 4 MiB message limit (a tick of 128 sessions'
# user audio is about 1 MB).
MAX_BODY_BYTES = 3 * 1024 * 1024


class BatchBuilder:
    """Collects one direction's items until the next batch is cut (``take``)."""

    def __init__(self, schema: Schema, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.schema = schema
        self.max_body_bytes = max_body_bytes
        self._full: list[tuple[list[tuple[Any, ...]], list[bytes]]] = []  # batches already at the bound
        self._records: list[tuple[Any, ...]] = []
        self._parts: list[bytes] = []
        self._size = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _span(self, data: bytes) -> tuple[int, int]:
        if not data:
            return _NO_SPAN
        start = self._size
        self._parts.append(data)
        self._size += len(data)
        return (start, len(data))

    def _new_item(self) -> None:
        self._count += 1
        if self._size >= self.max_body_bytes:
            self._full.append((self._records, self._parts))
            self._records, self._parts, self._size = [], [], 0

    def add(self, request: int, msg: Any, *, timeout_ms: int = 0) -> None:
        """One per-request message of this direction's schema."""
        self._new_item()
        sc = self.schema
        arm = msg.WhichOneof(sc.oneof)
        if arm == "credit":
            c = msg.credit
            self._records.append(
                (request, CREDIT, c.unit, 0, 0, 0, c.amount, 0, 0, 0, 0, timeout_ms, _NO_SPAN, _NO_SPAN,
                 _NO_SPAN)
            )  # fmt: skip
            return
        if arm is not None and arm == sc.frames:
            f = getattr(msg, arm)
            if f.codes.WhichOneof("body") == "inline":
                self._records.append(
                    (
                        request, FRAMES, 0, f.num_groups, f.segment_index, f.frame_count, f.first_frame, 0,
                        f.user_frame, f.sent_unix_ns, 0, timeout_ms, self._span(f.codes.inline),
                        self._span(f.text_tokens), self._span(f.transcript_delta.encode()),
                    )
                )  # fmt: skip
                return
        elif arm is not None and arm == sc.pcm:
            p = getattr(msg, arm)
            if p.data.WhichOneof("body") == "inline":
                self._records.append(
                    (
                        request, PCM, p.format, 0, p.segment_index, p.sample_count, p.sample_offset,
                        p.first_frame, p.user_frame, p.sent_unix_ns, p.frame_count, timeout_ms,
                        self._span(p.data.inline), _NO_SPAN, self._span(p.transcript_delta.encode()),
                    )
                )  # fmt: skip
                return
        # Control messages, and data whose payload already went through shared memory: the message whole.
        self._signal(request, MESSAGE, msg.SerializeToString(), timeout_ms=timeout_ms)

    def signal(self, request: int, kind: int, *, code: int = 0, details: str = "") -> None:
        """A link signal for one request: ``HALF_CLOSE``, ``RESET`` or ``END`` (``code``: its status)."""
        if kind not in (HALF_CLOSE, RESET, END):
            raise ValueError(f"not a link signal: {kind}")
        self._signal(request, kind, details.encode(), code=code)

    def _signal(self, request: int, kind: int, data: bytes, *, code: int = 0, timeout_ms: int = 0) -> None:
        if kind != MESSAGE:
            self._new_item()  # (``add`` counted its MESSAGE item already)
        self._records.append(
            (request, kind, 0, 0, 0, code, 0, 0, 0, 0, 0, timeout_ms, self._span(data), _NO_SPAN, _NO_SPAN)
        )

    def take(self) -> tuple[bytes, bytes]:
        """The packed records and the body slab of the oldest items not yet taken: all of them, or as many
        whole items as fill one batch to its bound (``len`` then says more remain)."""
        if self._full:
            records, parts = self._full.pop(0)
        else:
            records, parts = self._records, self._parts
            self._records, self._parts, self._size = [], [], 0
        self._count -= len(records)
        return np.array(records, dtype=ITEM).tobytes(), b"".join(parts)


def unpack(items: bytes) -> np.ndarray:
    """The records of a batch, a view of its bytes (no copy)."""
    if len(items) % ITEM.itemsize:
        raise ValueError(f"LinkBatch.items: {len(items)} bytes is not whole {ITEM.itemsize}-byte records")
    return np.frombuffer(items, dtype=ITEM)


def _cut(body: memoryview, span: Any) -> bytes:
    start, length = span
    if start + length > len(body):
        raise ValueError(f"LinkBatch: span ({start}, {length}) outside the {len(body)}-byte body")
    return bytes(body[start : start + length])


# Field positions in a record's tuple (``ndarray.tolist``), read once per batch rather than per field.
(_REQ, _KIND, _FMT, _GROUPS, _SEG, _COUNT, _FIRST, _FFRAME, _UFRAME, _SENT, _FCOUNT, _TIMEOUT, _DATA, _TOKENS,
 _TEXT) = range(15)  # fmt: skip


def _text(body: memoryview, span: Any) -> str:
    return _cut(body, span).decode() if span[1] else ""


def messages(schema: Schema, records: np.ndarray, body: bytes) -> Iterator[tuple[int, int, Any, int]]:
    """``(request, kind, message, timeout_ms)`` for each record in order: the per-request message for data
    and ``MESSAGE`` items (of ``schema``), ``(code, details)`` for ``END``, None for the other signals.

    Messages are filled in place (``msg.pcm.sample_offset = ...``): a nested message passed to a
    constructor is copied whole, payload included, which cost twice the time per item."""
    view = memoryview(body)
    cls = schema.message
    for r in records.tolist():
        kind = r[_KIND]
        if kind == CREDIT:
            msg: Any = cls()
            c = msg.credit
            c.unit = r[_FMT]
            c.amount = r[_FIRST]
        elif kind == FRAMES:
            if schema.frames is None:
                raise ValueError("LinkBatch: frames item in a direction that carries none")
            msg = cls()
            f = getattr(msg, schema.frames)
            f.first_frame = r[_FIRST]
            f.frame_count = r[_COUNT]
            f.num_groups = r[_GROUPS]
            f.segment_index = r[_SEG]
            f.text_tokens = _cut(view, r[_TOKENS])
            f.transcript_delta = _text(view, r[_TEXT])
            f.sent_unix_ns = r[_SENT]
            f.user_frame = r[_UFRAME]
            f.codes.inline = _cut(view, r[_DATA])
        elif kind == PCM:
            if schema.pcm is None:
                raise ValueError("LinkBatch: pcm item in a direction that carries none")
            msg = cls()
            p = getattr(msg, schema.pcm)
            p.sample_offset = r[_FIRST]
            p.sample_count = r[_COUNT]
            p.format = r[_FMT]
            p.segment_index = r[_SEG]
            p.first_frame = r[_FFRAME]
            p.frame_count = r[_FCOUNT]
            p.transcript_delta = _text(view, r[_TEXT])
            p.sent_unix_ns = r[_SENT]
            p.user_frame = r[_UFRAME]
            p.data.inline = _cut(view, r[_DATA])
        elif kind == MESSAGE:
            msg = cls.FromString(_cut(view, r[_DATA]))
        elif kind == END:
            msg = (r[_COUNT], _cut(view, r[_DATA]).decode(errors="replace"))
        elif kind in (HALF_CLOSE, RESET):
            msg = None
        else:
            raise ValueError(f"LinkBatch: unknown item kind {kind}")
        yield r[_REQ], kind, msg, r[_TIMEOUT]
