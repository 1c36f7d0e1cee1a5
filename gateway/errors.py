"""One error type for the gateway, rendered as a rich gRPC status or an OpenAI-shaped HTTP error.

Every rejection names the offending field (``field: problem``), so the same ``GatewayError`` reads well in a
gRPC status, in ``{"error": {"param": ...}}`` and in logs. Retryable refusals carry a retry hint, sent as
``google.rpc.RetryInfo`` on gRPC and ``Retry-After`` on HTTP.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

log = logging.getLogger(__name__)

# The HTTP status each gRPC code maps to (google.rpc.Code's documented HTTP mapping).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNKNOWN: 500,
}
_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}
ERROR_DOMAIN = "voxstage.dev"


class GatewayError(Exception):
    """A request failure with its gRPC code, the field to blame and an optional retry hint (seconds)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: float | None = None,
        reason: str | None = None,
        http_status: int | None = None,
    ) -> None:
        # The field leads the message so a bare status string still says what to fix.
        self.text = f"{field}: {message}" if field else message
        super().__init__(self.text)
        self.code = code
        self.field = field
        self.retry_after_s = retry_after_s
        self.reason = reason or code.name.lower()
        self._http_status = http_status

    @property
    def http_status(self) -> int:
        """The mapped status, unless HTTP has a more precise one (413 for an oversized body)."""
        return self._http_status or HTTP_STATUS.get(self.code, 500)

    @property
    def outcome(self) -> str:
        """The ``voxstage_requests_total{outcome}`` label for a request that ended with this error."""
        return _OUTCOMES.get(self.code, "error")


_OUTCOMES = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid",
    grpc.StatusCode.FAILED_PRECONDITION: "invalid",
    grpc.StatusCode.OUT_OF_RANGE: "invalid",
    grpc.StatusCode.NOT_FOUND: "invalid",
    grpc.StatusCode.ALREADY_EXISTS: "invalid",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "rejected",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.CANCELLED: "cancelled",
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline_exceeded",
}


def as_gateway_error(exc: Exception) -> GatewayError:
    """Any failure as a status: a bug still answers INTERNAL with its cause, never UNKNOWN."""
    if isinstance(exc, GatewayError):
        return exc
    log.exception("request failed", exc_info=exc)
    cause = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""  # no traceback, no megabytes
    return GatewayError(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {cause}")


def invalid(field: str, message: str, *, reason: str = "invalid_value") -> GatewayError:
    return GatewayError(grpc.StatusCode.INVALID_ARGUMENT, message, field=field, reason=reason)


def not_found(field: str, message: str, *, reason: str) -> GatewayError:
    return GatewayError(grpc.StatusCode.NOT_FOUND, message, field=field, reason=reason)


def code_from_number(number: int) -> grpc.StatusCode:
    """The StatusCode for an in-band ``StreamError.code``; unknown numbers become INTERNAL."""
    code = _BY_NUMBER.get(number)
    if code is None or code is grpc.StatusCode.OK:
        return grpc.StatusCode.INTERNAL
    return code


def rich_status(err: GatewayError) -> grpc.Status:
    """The status with ``BadRequest`` / ``RetryInfo`` / ``ErrorInfo`` details packed in its trailers."""
    proto = status_pb2.Status(code=getattr(code_pb2, err.code.name), message=err.text)
    info = error_details_pb2.ErrorInfo(reason=err.reason.upper(), domain=ERROR_DOMAIN)
    proto.details.add().Pack(info)
    if err.field is not None and err.code is grpc.StatusCode.INVALID_ARGUMENT:
        violation = error_details_pb2.BadRequest.FieldViolation(field=err.field, description=err.text)
        proto.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    if err.retry_after_s is not None:
        seconds = max(err.retry_after_s, 0.0)
        delay = duration_pb2.Duration(seconds=int(seconds), nanos=int((seconds % 1) * 1e9))
        proto.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return rpc_status.to_status(proto)


async def abort(context: grpc.aio.ServicerContext[Any, Any], err: GatewayError) -> None:
    """End the RPC with ``err`` (raises, as ``context.abort`` does)."""
    status = rich_status(err)
    await context.abort(status.code, status.details, status.trailing_metadata)


_OPENAI_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}


def openai_error(
    message: str, *, status: int, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_body(err: GatewayError) -> dict[str, Any]:
    return openai_error(err.text, status=err.http_status, param=err.field, code=err.reason)


def retry_after_header(err: GatewayError) -> dict[str, str]:
    """``Retry-After`` in whole seconds (the header takes no fractions), at least 1."""
    if err.retry_after_s is None:
        return {}
    return {"Retry-After": str(max(1, math.ceil(err.retry_after_s)))}
