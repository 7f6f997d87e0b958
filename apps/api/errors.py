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
