"""Q8_0 wire codec for activations (hidden states between nodes).

    encode_rows_q8_0(x f32 [tokens, d]) -> bytes: tokens rows of ceil(d/32) block_q8_0
    decode_rows_q8_0(bytes, tokens, d)  -> f32 [tokens, d]

Choice for d not a multiple of 32: each row is zero-padded to the next multiple of 32
before quantizing (zeros do not change a block's amax, so the real values quantize as
they would anyway) and the padding is dropped on decode.  Nothing needs recording: both
sides know d.  Row size is ceil(d/32)*34 bytes (8.5 bits per value).
Pure module, never Django.

Where setup.py built it, core/quantization/_q8_rows.c encodes and decodes in one call each (a
decode step's row costs the numpy path's checks and passes more than its values); it writes the
same bytes and floats as the numpy/numba path below, which stays for where no compiler was.
"""

from __future__ import annotations

import numpy as np

from .f16 import f16_bits_to_f32
from .registry import dequantize, quantize
from .types import QK8_0, GGMLType

try:  # built by setup.py where a compiler was there; optional, like the expert kernels
    from core.quantization import _q8_rows
except ImportError:  # pragma: no cover - the numpy/numba path writes the same bytes
    _q8_rows = None

BLOCK_BYTES = GGMLType.Q8_0.type_size  # 34: f16 d + 32 x int8
_NON_FINITE_INPUT, _SCALE_OVERFLOW, _NON_FINITE_SCALE = 1, 2, 3  # _q8_rows' refusals


def row_bytes_q8_0(d: int) -> int:
    """Bytes per encoded row of d values."""
    return -(-d // QK8_0) * BLOCK_BYTES


def encode_rows_q8_0(x: np.ndarray) -> bytes:
    """f32 [tokens, d] -> Q8_0 blocks, rows zero-padded to a multiple of 32; ValueError if non-finite."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"expected activations [tokens, d] with d > 0, got shape {x.shape}")
    tokens, d = x.shape
    if _q8_rows is not None:
        encoded = _q8_rows.encode(np.ascontiguousarray(x), tokens, d)  # bytes, or why not
        if encoded == _NON_FINITE_INPUT:
            raise ValueError("cannot quantize to Q8_0: input has non-finite values")
        if encoded == _SCALE_OVERFLOW:
            raise ValueError(f"values overflow the f16 scales of Q8_0 (max |x| = {np.abs(x).max()})")
        return encoded
    return encode_rows_q8_0_numpy(x)


def encode_rows_q8_0_numpy(x: np.ndarray) -> bytes:
    """encode_rows_q8_0 through core.quantization's registry (numba or numpy): the reference."""
    tokens, d = x.shape
    padded = -(-d // QK8_0) * QK8_0
    if padded != d:
        x = np.pad(x, ((0, 0), (0, padded - d)))
    if tokens == 0:
        return b""
    return quantize(x, GGMLType.Q8_0).tobytes()


def decode_rows_q8_0(data: bytes, tokens: int, d: int) -> np.ndarray:
    """Inverse of encode_rows_q8_0; ValueError on a wrong byte count or a non-finite scale."""
    if tokens < 0 or d <= 0:
        raise ValueError(f"bad activation shape tokens={tokens}, d={d}")
    nbytes = row_bytes_q8_0(d)
    if len(data) != tokens * nbytes:
        raise ValueError(f"Q8_0 activations [{tokens}, {d}] need {tokens * nbytes} bytes, got {len(data)}")
    if tokens == 0:
        return np.empty((0, d), dtype=np.float32)
    if _q8_rows is not None:
        out = np.empty((tokens, d), dtype=np.float32)
        if _q8_rows.decode(data, out, tokens, d) == _NON_FINITE_SCALE:
            raise ValueError("Q8_0 activations have non-finite block scales")
        return out
    return decode_rows_q8_0_numpy(data, tokens, d)


def decode_rows_q8_0_numpy(data: bytes, tokens: int, d: int) -> np.ndarray:
    """decode_rows_q8_0 through core.quantization's registry, for whole rows: the reference."""
    nbytes = row_bytes_q8_0(d)
    padded = nbytes // BLOCK_BYTES * QK8_0
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, BLOCK_BYTES)
    if not np.isfinite(f16_bits_to_f32(raw[:, :2])).all():
        raise ValueError("Q8_0 activations have non-finite block scales")
    out = dequantize(raw, GGMLType.Q8_0, (tokens, padded))
    return out if padded == d else np.ascontiguousarray(out[:, :d])
