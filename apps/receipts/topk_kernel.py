"""The sketch's top-k selection compiled (numba): one pass per row, no sort, no temporaries.

Pure module. Same rule as apps.receipts.commitment.topk_reference (the numpy form): the k
features of largest |value|, ties to the lower index, returned in ascending index order.
Scanning a row in index order, a feature replaces the weakest kept one only when its magnitude
is strictly greater (a tie keeps the earlier, lower index); the kept set stays sorted by
(magnitude descending, index ascending), so the weakest is always the last. After the first k
features a replacement is rare (about k·ln(d/k) per row).

`sketch_q8_0` reads a Q8_0 answer's blocks directly (no decode): a value is its block's f16
scale widened to f32 times the int8 as f32 — the very product the decoder computes, so the
bits are the same — and a whole block is skipped when |scale| * 128 (no int8 is larger) cannot
beat the weakest kept feature. What a row costs is mostly its ~k·ln(d/k) insertions: ~1.5 µs
for d = 2048, k = 16 (bench/receipts.py).
"""

from __future__ import annotations

import numba
import numpy as np

from core.quantization.f16 import F16_TO_F32

Q8_BLOCK, Q8_BLOCK_BYTES = 32, 34


@numba.njit(cache=True, nogil=True, inline="always")  # pragma: no cover - compiled
def _keep(mags: np.ndarray, idx: np.ndarray, filled: int, m: np.float32, j: int) -> int:
    """Insert feature j of magnitude m into the kept set (sorted by |v| desc, index asc); returns
    the new fill count. Called only when the set is not full or m beats its weakest."""
    k = mags.shape[0]
    p = filled if filled < k else k - 1
    while p > 0 and mags[p - 1] < m:
        mags[p] = mags[p - 1]
        idx[p] = idx[p - 1]
        p -= 1
    mags[p] = m
    idx[p] = j
    return filled + 1 if filled < k else k


@numba.njit(cache=True, nogil=True)  # pragma: no cover - compiled; no fastmath: compares must be exact
def topk_rows(rows: np.ndarray, k: int) -> np.ndarray:
    """int64 [n, k] for rows f32 [n, d], 1 <= k <= d."""
    n, d = rows.shape
    out = np.empty((n, k), dtype=np.int64)
    mags = np.empty(k, dtype=np.float32)
    idx = np.empty(k, dtype=np.int64)
    for r in range(n):
        filled = 0
        for j in range(d):
            m = abs(rows[r, j])
            if filled < k or m > mags[k - 1]:
                filled = _keep(mags, idx, filled, m, j)
        out[r, :] = np.sort(idx)
    return out


@numba.njit(cache=True, nogil=True)  # pragma: no cover - compiled
def _sketch_q8_0(raw: np.ndarray, d: int, k: int, lut: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = raw.shape[0]
    n_blocks = raw.shape[1] // Q8_BLOCK_BYTES
    out_idx = np.empty((n, k), dtype=np.int64)
    out_val = np.empty((n, k), dtype=np.float32)
    mags = np.empty(k, dtype=np.float32)
    idx = np.empty(k, dtype=np.int64)
    for r in range(n):
        filled = 0
        for b in range(n_blocks):
            base = b * Q8_BLOCK_BYTES
            scale = lut[np.int64(raw[r, base]) | (np.int64(raw[r, base + 1]) << 8)]
            if filled == k and abs(scale) * np.float32(128.0) <= mags[k - 1]:
                continue  # no value of this block can beat the weakest kept one
            stop = min(Q8_BLOCK, d - b * Q8_BLOCK)  # the last block's padding is not a feature
            for i in range(stop):
                m = abs(scale * np.float32(np.int8(raw[r, base + 2 + i])))
                if filled < k or m > mags[k - 1]:
                    filled = _keep(mags, idx, filled, m, b * Q8_BLOCK + i)
        order = np.sort(idx)
        for c in range(k):
            j = order[c]
            base = (j // Q8_BLOCK) * Q8_BLOCK_BYTES
            scale = lut[np.int64(raw[r, base]) | (np.int64(raw[r, base + 1]) << 8)]
            out_idx[r, c] = j
            out_val[r, c] = scale * np.float32(np.int8(raw[r, base + 2 + j % Q8_BLOCK]))
    return out_idx, out_val


def sketch_q8_0(data: bytes | bytearray | memoryview, *, tokens: int, d_model: int,
                k: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 rows (core.quantization.activations' layout) -> (indices int64 [tokens, k], values f32
    [tokens, k]) of the rows they decode to, 1 <= k <= d_model. ValueError on a wrong byte count."""
    row_bytes = -(-d_model // Q8_BLOCK) * Q8_BLOCK_BYTES
    if len(data) != tokens * row_bytes:
        raise ValueError(f"Q8_0 rows [{tokens}, {d_model}] need {tokens * row_bytes} bytes, got {len(data)}")
    raw = np.frombuffer(data, dtype=np.uint8).reshape(tokens, row_bytes)
    return _sketch_q8_0(raw, d_model, k, F16_TO_F32)
