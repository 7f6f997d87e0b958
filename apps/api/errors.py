"""Domain errors and their one mapping to JSON-RPC error codes and HTTP statuses.

Services raise `TenzroError` subclasses; the JSON-RPC dispatcher and the REST routes
both translate them here, so a client sees the same `reason` on either edge.
"""

from __future__ import annotations

from typing import Any

# JSON-RPC 2.0 standard codes (https://www.jsonrpc.org/specification#error_object).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class TenzroError(Exception):
    """An application error with a machine-readable reason.

    `code` is the JSON-RPC error code (the -32000..-32099 server range for application
    errors), `http_status` the REST status, `reason` a stable snake_case string.
    """

    code = -32000
    http_status = 400
    reason = "application_error"

    def __init__(self, message: str, *, reason: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.details = details

    def data(self) -> dict[str, Any]:
        return {"reason": self.reason, **self.details}


class InvalidInput(TenzroError):
    """The request was well-formed JSON-RPC but its content is wrong (shape, NaN, range)."""

    code = INVALID_PARAMS
    http_status = 422
    reason = "invalid_input"


class Unauthorized(TenzroError):
    code = -32001
    http_status = 401
    reason = "unauthorized"


class NotFound(TenzroError):
    code = -32004
    http_status = 404
    reason = "not_found"


class Conflict(TenzroError):
    code = -32009
    http_status = 409
    reason = "conflict"


class PayloadTooLarge(TenzroError):
    code = -32013
    http_status = 413
    reason = "payload_too_large"


class Unavailable(TenzroError):
    """A process of this node (or a peer) that the call needs did not answer in time."""

    code = -32003
    http_status = 503
    reason = "unavailable"


def error_object(code: int, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return error


# Reasons reported by other processes (the expert worker, peers) and the class each maps to.
_REASON_CLASSES: dict[str, type[TenzroError]] = {
    "expert_not_loaded": NotFound,
    "gate_not_loaded": NotFound,
    "method_not_found": NotFound,
    "shape_mismatch": InvalidInput,
    "non_finite_input": InvalidInput,
    "invalid_payload": InvalidInput,
    "model_mismatch": InvalidInput,
    "invalid_input": InvalidInput,
    "payload_too_large": PayloadTooLarge,
    "invalid_uri": InvalidInput,
    "invalid_hash": InvalidInput,
    "not_found": NotFound,
    "blob_not_found": NotFound,
}


def error_for_reason(reason: str, message: str) -> TenzroError:
    """The TenzroError for a reason another process reported (generic class if unknown)."""
    return _REASON_CLASSES.get(reason, TenzroError)(message, reason=reason)
