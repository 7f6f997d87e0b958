"""Reading a worker method's params: the one place each kind of param is checked.

Worker methods (apps/worker/doors.py) take a JSON header of params and a binary body; these
helpers raise InvalidInput (or ShapeMismatch for rows) naming the param and what it was, so a
peer's malformed request is answered with its reason and never reaches the runtime.
Pure module (no Django).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from core.errors import InvalidInput
from core.experts.errors import ShapeMismatch
from core.formats.wire import decode_rows, rows_from_bytes


def int_param(params: dict[str, Any], name: str) -> int:
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"param {name!r} must be a non-negative integer, got {value!r}")
    return value


def str_param(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"param {name!r} must be a non-empty string, got {value!r}")
    return value


def hidden_param(params: dict[str, Any], body: bytes | bytearray) -> np.ndarray:
    """The request body as f32 [tokens, d_model]: the one place hidden rows are shape-checked."""
    d_model = params.get("d_model")
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model <= 0:
        raise InvalidInput(f"param 'd_model' must be a positive integer, got {d_model!r}")
    tokens = params.get("tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        raise InvalidInput(f"param 'tokens' must be a non-negative integer, got {tokens!r}")
    try:
        return rows_from_bytes(body, d_model=d_model, tokens=tokens)
    except ValueError as exc:
        raise ShapeMismatch(str(exc)) from exc


def encoded_rows_param(params: dict[str, Any], body: bytes | bytearray, encoding: str) -> np.ndarray:
    """Encoded rows -> f32 [tokens, d_model]; `tokens` is required, since block rows do not say."""
    d_model, tokens = params.get("d_model"), params.get("tokens")
    for name, value in (("d_model", d_model), ("tokens", tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (name == "d_model"):
            raise InvalidInput(f"param {name!r} must be a {'positive' if name == 'd_model' else 'non-negative'} "
                               f"integer with encoding {encoding}, got {value!r}")
    try:
        return decode_rows(body, encoding, tokens=tokens, d_model=d_model)
    except ValueError as exc:
        raise ShapeMismatch(str(exc)) from exc


def flag_param(params: dict[str, Any], name: str) -> bool:
    """An optional boolean param (absent: false)."""
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"param {name!r} must be true or false, got {value!r}")
    return value


def fraction_param(params: dict[str, Any], name: str) -> float:
    """An optional number in [0, 1] (absent: 0)."""
    value = params.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0.0 <= value <= 1.0):
        raise InvalidInput(f"param {name!r} must be a number in [0, 1], got {value!r}")
    return float(value)


MAX_BATCHES = 1024  # experts in one multi-expert request: more than any layer's top-k times its holders


def batches_param(params: dict[str, Any], rows: int) -> list[tuple[int, list[int]]]:
    """A multi-expert request's `batches`: [{expert, rows}], each expert once, each `rows` a non-empty,
    strictly ascending list of positions into the body's `rows` rows -> [(expert, rows)] in order.
    The whole frame is refused, naming the first problem, before anything runs."""
    value = params.get("batches")
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_BATCHES:
        raise InvalidInput(f"param 'batches' must be a list of 1 to {MAX_BATCHES} objects {{expert, rows}}, "
                           f"got {str(value)[:100]}")
    out: list[tuple[int, list[int]]] = []
    seen: set[int] = set()
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"expert", "rows"}:
            raise InvalidInput(f"batches[{i}] must be an object with exactly 'expert' and 'rows', "
                               f"got {str(item)[:100]}")
        expert, positions = item["expert"], item["rows"]
        if isinstance(expert, bool) or not isinstance(expert, int) or expert < 0:
            raise InvalidInput(f"batches[{i}].expert must be a non-negative integer, got {expert!r}")
        if expert in seen:
            raise InvalidInput(f"expert {expert} is listed twice in 'batches': one entry per expert",
                               reason="duplicate_expert")
        seen.add(expert)
        if not isinstance(positions, list) or not positions or any(
                isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < rows for r in positions):
            raise InvalidInput(f"batches[{i}].rows (expert {expert}) must be a non-empty list of row positions "
                               f"in [0, {rows}), the body's rows")
        if any(a >= b for a, b in pairwise(positions)):
            raise InvalidInput(f"batches[{i}].rows (expert {expert}) must be strictly ascending (each row once)")
        out.append((expert, positions))
    return out
