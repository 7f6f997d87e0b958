"""Application errors and their machine-readable reasons: the one table every part uses.

Pure module (no Django, no I/O): services, selectors, worker handlers and the pure cores
raise these; the JSON-RPC dispatcher, the REST routes, the worker's two doors and the CLI
translate them. Every error carries a stable snake_case ``reason`` (JSON-RPC
``error.data.reason``, REST ``reason``, QUIC error-frame ``error.reason``) and a message
for people that names what was wrong.

The reason decides the kind of error (its JSON-RPC code and HTTP status) through REASONS
below, so an error that crossed a process boundary as a bare reason string (a worker reply,
a peer's error frame) is rebuilt as the same kind on this side (`error_for_reason`).
"""

from __future__ import annotations

from typing import Any


class TenzroError(Exception):
    """An application error with a machine-readable reason.

    Subclasses set a default ``reason``; a caller may pass a more precise one
    (``InvalidInput("...", reason="invalid_quant")``). ``code`` (JSON-RPC) and
    ``http_status`` follow the kind that REASONS assigns to the reason, else the class's.
    ``details`` are extra machine-readable fields reported next to the reason.
    """

    reason = "application_error"
    _code = -32000
    _http_status = 400

    def __init__(self, message: str, *, reason: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.details = details

    @property
    def kind(self) -> type[TenzroError]:
        return REASONS.get(self.reason, type(self))

    @property
    def code(self) -> int:
        return self.kind._code

    @property
    def http_status(self) -> int:
        return self.kind._http_status

    def data(self) -> dict[str, Any]:
        return {"reason": self.reason, **self.details}


class InvalidInput(TenzroError):
    """The request was well-formed but its content is wrong (shape, NaN, range, payload)."""

    reason = "invalid_input"
    _code = -32602  # JSON-RPC "Invalid params"
    _http_status = 422


class Unauthorized(TenzroError):
    """A method that changes the node was called without the operator token."""

    reason = "unauthorized"
    _code = -32001
    _http_status = 401


class Forbidden(TenzroError):
    """The method exists but is not served at this door (an operator method asked of a peer)."""

    reason = "forbidden"
    _code = -32002
    _http_status = 403


class Unavailable(TenzroError):
    """A process of this node, or a peer, that the call needs did not answer in time."""

    reason = "unavailable"
    _code = -32003
    _http_status = 503


class NotFound(TenzroError):
    reason = "not_found"
    _code = -32004
    _http_status = 404


class Conflict(TenzroError):
    reason = "conflict"
    _code = -32009
    _http_status = 409


class PayloadTooLarge(TenzroError):
    reason = "payload_too_large"
    _code = -32013
    _http_status = 413


class RateLimited(TenzroError):
    """A peer went over its request rate or its concurrent-stream limit; retry later."""

    reason = "rate_limited"
    _code = -32029
    _http_status = 429


class InternalError(TenzroError):
    """A bug on the answering side (logged there)."""

    reason = "internal_error"
    _code = -32603
    _http_status = 500


def _kinds(kind: type[TenzroError], *reasons: str) -> dict[str, type[TenzroError]]:
    return dict.fromkeys(reasons, kind)


# Every reason the node reports, and its kind. A new reason is added here, once.
REASONS: dict[str, type[TenzroError]] = {
    **_kinds(InvalidInput,
             # request bodies that are not JSON or not a JSON-RPC request (apps/api/json_body.py)
             "parse_error", "nesting_too_deep", "invalid_unicode", "non_finite_literal", "number_out_of_range",
             "invalid_request",
             # requests: params the schema refuses, content it cannot describe
             "invalid_input", "invalid_params", "shape_mismatch", "non_finite_input", "invalid_payload",
             "model_mismatch", "invalid_policy", "invalid_quant", "checkpoint_required", "token_out_of_range",
             "not_a_file", "unreadable_file", "invalid_routings", "unsupported_encoding", "duplicate_expert",
             # blobs
             "invalid_uri", "invalid_hash", "hash_mismatch", "range_invalid",
             # QUIC frames (docs/protocol.md)
             "bad_request", "bad_frame", "bad_magic", "unsupported_version", "truncated_frame",
             # checkpoints and slicing (prepare jobs)
             "config_invalid", "config_missing_key", "config_unsupported", "index_invalid", "header_corrupt",
             "header_too_large", "header_truncated", "offsets_invalid", "dtype_unsupported", "tensor_missing",
             "short_read", "range_ignored", "fetch_failed", "expert_out_of_range", "layer_not_moe",
             "unsupported_layout", "shape_incomplete", "non_finite", "layer_is_moe", "layer_not_dense",
             "dense_slices_out_of_range",
             # placement (apps/repair/placement.py)
             "job_not_done", "not_a_provider"),
    **_kinds(Unauthorized, "unauthorized"),
    **_kinds(Forbidden, "forbidden"),
    **_kinds(Unavailable, "unavailable", "worker_unavailable", "redis_unavailable", "deadline_exceeded", "timeout",
             "interrupted", "dense_reloading",
             "connection_failed",
             "connection_closed", "certificate_pin_mismatch", "forward_incomplete", "gate_mass_lost",
             "unreachable", "bad_answer", "remote_error", "transport_error", "bad_receipt", "receipt_missing",
             "expert_unavailable"),
    **_kinds(NotFound, "not_found", "expert_not_loaded", "payload_corrupt", "gate_not_loaded", "method_not_found",
             "blob_not_found",
             "job_not_found", "receipt_not_found", "policy_not_found", "no_active_policy", "unknown_model",
             "file_not_found", "dense_not_loaded", "unknown_generation"),
    **_kinds(Conflict, "conflict", "policy_not_proposed", "state_not_published"),
    **_kinds(PayloadTooLarge, "payload_too_large", "too_large", "over_budget", "batch_too_large", "kv_budget_exceeded"),
    **_kinds(RateLimited, "rate_limited", "too_many_streams", "busy"),
    **_kinds(InternalError, "internal_error"),
}


def error_for_reason(reason: str, message: str, **details: Any) -> TenzroError:
    """The error of `reason`'s kind, as reported by another process (generic if unknown)."""
    return REASONS.get(reason, TenzroError)(message, reason=reason, **details)
