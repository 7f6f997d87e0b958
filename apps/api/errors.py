"""JSON-RPC 2.0's own error codes and the error object (spec: jsonrpc.org/specification#error_object).

Application errors, their reasons and their codes live in core/errors.py; this module only
adds what the JSON-RPC protocol itself defines.
"""

from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


def error_object(code: int, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return error


def describe_errors(errors: list[dict[str, Any]], *, limit: int = 3) -> str:
    """One line naming each invalid field and why, for a person reading an error message:
    ``blob_uri: String should match pattern '^sha256:…'; d_model: Field required (and 2 more)``.
    ``errors``: pydantic's ``{"loc", "msg"}`` items; the full list stays in the error's data."""
    parts = [f"{'.'.join(str(step) for step in e.get('loc', ())) or 'params'}: {e.get('msg', 'invalid')}"
             for e in errors[:limit]]
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return "; ".join(parts) + more
