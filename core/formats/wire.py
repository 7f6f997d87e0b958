"""Hidden-state rows on the wire: raw little-endian f32, or Q8_0 blocks (activation codecs).

Pure module (no Django). Shapes are checked here so a wrong d_model or a truncated buffer
is named before anything reaches the runtime. WIRE_CODECS lists what this node speaks, in
its order of preference for the data plane: Q8_0 carries 8.5 bits per value against f32's
32 (3.76x fewer bytes) at a rounding error of at most half a step of each 32-value block's
amax/127 (docs/protocol.md, "Activation codecs").
"""

from __future__ import annotations

import numpy as np

from core.quantization.activations import decode_rows_q8_0, encode_rows_q8_0, row_bytes_q8_0

F32 = np.dtype("<f4")
WIRE_CODECS = ("q8_0", "f32")


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



def encoded_row_bytes(encoding: str, d_model: int) -> int:
    return d_model * F32.itemsize if encoding == "f32" else row_bytes_q8_0(d_model)


def encode_rows(rows: np.ndarray, encoding: str) -> bytes:
    """f32 [tokens, d] -> bytes in `encoding` (ValueError on non-finite rows for q8_0)."""
    if encoding == "f32":
        return rows_to_bytes(rows)
    if encoding == "q8_0":
        return encode_rows_q8_0(rows)
    raise ValueError(f"unknown activation encoding {encoding!r}; known: {list(WIRE_CODECS)}")


def decode_rows(data: bytes | bytearray | memoryview, encoding: str, *, tokens: int, d_model: int) -> np.ndarray:
    """bytes in `encoding` -> f32 [tokens, d_model]; ValueError names a wrong byte count."""
    if encoding == "f32":
        return rows_from_bytes(data, d_model=d_model, tokens=tokens)
    if encoding == "q8_0":
        return decode_rows_q8_0(data, tokens, d_model)  # type: ignore[arg-type]  # any buffer works
    raise ValueError(f"unknown activation encoding {encoding!r}; known: {list(WIRE_CODECS)}")
