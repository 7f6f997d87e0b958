"""Request bodies as JSON (RFC 8259), parsed once by both edges with a reason for each refusal.

orjson, not the standard library's json: json.loads recurses once per nesting level (a body of
100,000 `[` raised RecursionError, a 500), accepts NaN/Infinity and lone surrogate escapes
(`"\\ud800"`, which no UTF-8 encoder can write back: answering them raised), and decodes
UTF-16/32 bodies that RFC 8259 does not allow. orjson refuses all of these, stops at 1,024
levels of nesting, and parses a 64 MB base64 body faster.
"""

from __future__ import annotations

from typing import Any

import orjson

from core.errors import InvalidInput

# orjson's own fixed limit (it cannot be changed); documented in docs/protocol.md.
MAX_NESTING = 1024

_NON_FINITE = ("NaN", "Infinity", "-Infinity", "+Infinity")


class JsonBodyError(InvalidInput):
    """The body is not JSON; `reason` says how (JSON-RPC answers it as -32700 Parse error)."""

    reason = "parse_error"


def _reason(exc: orjson.JSONDecodeError) -> tuple[str, str]:
    msg, doc, pos = exc.msg, exc.doc or "", exc.pos
    if "depth limit" in msg:
        return "nesting_too_deep", f"JSON nested deeper than {MAX_NESTING} levels"
    if "UTF-8" in msg or "surrogate" in msg:
        return "invalid_unicode", f"body is not valid UTF-8 JSON text ({msg})"
    if "infinity when parsed" in msg:
        return "number_out_of_range", f"a number at character {pos} is out of the range of a double"
    near = doc[max(pos - 1, 0):pos + 9]
    if any(literal in near for literal in _NON_FINITE):
        return "non_finite_literal", f"NaN/Infinity at character {pos} is not JSON (RFC 8259 has no NaN or Infinity)"
    return "parse_error", f"body is not JSON: {msg} at character {pos}"


def loads(body: bytes) -> Any:
    """Parse `body`; JsonBodyError with reason parse_error, nesting_too_deep, invalid_unicode,
    non_finite_literal or number_out_of_range otherwise."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        reason, message = _reason(exc)
        raise JsonBodyError(message, reason=reason) from None
