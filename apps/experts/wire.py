"""Hidden-state rows as raw little-endian f32 bytes (frames, the operator door).

Pure module (no Django). Shapes are checked here so a wrong d_model or a truncated buffer
is named before anything reaches the runtime.
"""

from __future__ import annotations

import numpy as np

F32 = np.dtype("<f4")


def rows_from_bytes(data: bytes | bytearray | memoryview, *, d_model: int, tokens: int | None = None) -> np.ndarray:
    """Raw little-endian f32 bytes -> f32 [tokens, d_model] (a view, no copy).

    Raises ValueError naming the byte count expected and received.
    """
    if d_model <= 0:
        raise ValueError(f"d_model must be positive, got {d_model}")
    row_bytes = d_model * F32.itemsize
    if len(data) % row_bytes:
        raise ValueError(
            f"hidden states of {len(data)} bytes are not whole rows of d_model={d_model} f32 "
            f"({row_bytes} bytes per row)"
        )
    count = len(data) // row_bytes
    if tokens is not None and count != tokens:
        raise ValueError(f"expected {tokens} rows of d_model={d_model}, got {count}")
    return np.frombuffer(data, dtype=F32).reshape(count, d_model)


def rows_to_bytes(rows: np.ndarray) -> bytes:
    """f32 [tokens, d] -> raw little-endian f32 bytes."""
    return np.ascontiguousarray(rows, dtype=F32).tobytes()

