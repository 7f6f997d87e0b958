"""The safetensors container's header, read one way for payloads in memory and checkpoint shards
fetched by range: an 8-byte little-endian length, then that many bytes of a JSON object.

Pure module (no Django). Raises ValueError naming the problem; each caller wraps it in its own
error (PayloadError, CheckpointError) with its own reason.
"""

from __future__ import annotations

import json
import struct
from typing import Any

LENGTH = struct.Struct("<Q")


def header_length(prefix: bytes | bytearray | memoryview, *, limit: int) -> int:
    """The header's byte length from the first 8 bytes; ValueError if short or over `limit`."""
    if len(prefix) < LENGTH.size:
        raise ValueError(f"{len(prefix)} bytes, shorter than the 8-byte header length")
    (length,) = LENGTH.unpack_from(prefix, 0)
    if length > limit:
        raise ValueError(f"header length {length} exceeds {limit} bytes")
    return length


def parse_header(raw: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The header JSON object; ValueError if it is not JSON or not an object."""
    try:
        header = json.loads(bytes(raw))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        # RecursionError: json.loads recurses per nesting level, and a header of "[[[[…" is short
        raise ValueError(f"header is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header
