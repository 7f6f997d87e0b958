"""The sketch's top-k selection compiled (numba): no full sort, no per-row temporaries.

Pure module. Same rule as apps.receipts.commitment.topk_reference (the numpy form): the k
features of largest |value|, ties to the lower index, returned in ascending index order.
Scanning a row in index order, a feature replaces the weakest kept one only when its magnitude
is strictly greater (a tie keeps the earlier, lower index); the kept set stays sorted by
(magnitude descending, index ascending), so the weakest is always the last. After the first k
features a replacement is rare (about k·ln(d/k) per row).

`sketch_q8_0` reads a Q8_0 answer's blocks directly (no decode): a value is its block's f16
scale widened to f32 times the int8 as f32 — the very product the decoder computes, so the
bits are the same. Most of a row never reaches the selection: a first pass takes each block's
largest |value| (|scale| times its largest |int8|, a min and a max the compiler vectorizes), and
the k-th largest of those is a floor that k values reach, so only the blocks at or above it are
scanned, and in them only the int8s large enough to reach it. A row whose scales are not all
finite is scanned whole, by the same rule. ~3.5 µs per row for d = 2048, k = 16 on a 2.4 GHz
AVX2 core, from ~5 with every block scanned (bench/receipts.py); what is left is mostly the
mispredicted branches of the two selections.

Where it was built, apps/receipts/_q8_sketch.c does the same in C (`sketch_q8_0` and
`sketch_q8_0_parts` pick it), its AVX2 variant without the per-value branches: ~0.4 µs per row on
an AVX-512 Xeon core where this kernel takes ~2 (bench/receipts.py prints both). This kernel stays
the reference the tests hold the C one to, and the path where no compiler was there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from core.quantization.f16 import F16_TO_F32

try:  # built by setup.py where a compiler was there; optional, like the expert kernels
    from apps.receipts import _q8_sketch
except ImportError:  # pragma: no cover - the numba kernel below computes the same bytes
    _q8_sketch = None

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
def _sketch_q8_0(raw: np.ndarray, d: int, k: int, lut: np.ndarray) -> np.ndarray:
    """uint32 [n, 2k]: per row the k indices, then the k values' f32 bits (the sketch's layout)."""
    n = raw.shape[0]
    n_blocks = raw.shape[1] // Q8_BLOCK_BYTES
    q = raw.view(np.int8)
    out = np.empty((n, 2 * k), dtype=np.uint32)
    value = np.empty(1, dtype=np.float32)
    value_bits = value.view(np.uint32)
    mags = np.empty(k, dtype=np.float32)
    idx = np.empty(k, dtype=np.int64)
    scales = np.empty(n_blocks, dtype=np.float32)
    block_max = np.empty(n_blocks, dtype=np.float32)
    for r in range(n):
        finite = True
        for b in range(n_blocks):
            base = b * Q8_BLOCK_BYTES
            scales[b] = abs(lut[np.int64(raw[r, base]) | (np.int64(raw[r, base + 1]) << 8)])
            finite = finite and np.isfinite(scales[b])
        # The floor: the k-th largest block maximum. k values reach it (each of those blocks' largest),
        # so every value of the top k does too, and a block whose maximum is below it holds none.
        floor = np.float32(-1.0)
        if finite and n_blocks >= k:
            for b in range(n_blocks):
                base = b * Q8_BLOCK_BYTES + 2
                stop = min(Q8_BLOCK, d - b * Q8_BLOCK)  # the last block's padding is not a feature
                hi = np.int8(-128)
                lo = np.int8(127)
                for i in range(stop):  # a min and a max vectorize; an abs per value does not
                    hi = max(hi, q[r, base + i])
                    lo = min(lo, q[r, base + i])
                block_max[b] = scales[b] * np.float32(max(np.int32(hi), -np.int32(lo)))
            held = 0
            for b in range(n_blocks):
                if held < k or block_max[b] > mags[k - 1]:
                    held = _keep(mags, idx, held, block_max[b], b)
            floor = mags[k - 1]
        filled = 0
        for b in range(n_blocks):
            if floor >= 0 and block_max[b] < floor:
                continue
            scale = scales[b]
            if filled == k and scale * np.float32(128.0) <= mags[k - 1]:
                continue  # no value of this block can beat the weakest kept one
            base = b * Q8_BLOCK_BYTES + 2
            # |int8| below `need` cannot reach the floor (one less for the product's rounding)
            need = np.int32(min(floor / scale, np.float32(256.0))) - 1 if floor > 0 and scale > 0 else np.int32(0)
            for i in range(min(Q8_BLOCK, d - b * Q8_BLOCK)):
                a = abs(np.int32(q[r, base + i]))
                if a >= need:
                    m = scale * np.float32(a)
                    if filled < k or m > mags[k - 1]:
                        filled = _keep(mags, idx, filled, m, b * Q8_BLOCK + i)
        idx.sort()
        for c in range(k):
            j = idx[c]
            base = (j // Q8_BLOCK) * Q8_BLOCK_BYTES
            scale = lut[np.int64(raw[r, base]) | (np.int64(raw[r, base + 1]) << 8)]
            value[0] = scale * np.float32(q[r, base + 2 + j % Q8_BLOCK])
            out[r, c] = j
            out[r, k + c] = value_bits[0]
    return out


def sketch_variant() -> str:
    """Which kernel sketch_q8_0 runs: the C extension's best variant ("avx2", "scalar"), else "numba"."""
    return _q8_sketch.variants()[0] if _q8_sketch is not None else "numba"


def sketch_q8_0(data: bytes | bytearray | memoryview, *, tokens: int, d_model: int, k: int,
                variant: str = "") -> np.ndarray:
    """Q8_0 rows (core.quantization.activations' layout) -> uint32 [tokens, 2k]: per row the k indices,
    then the f32 bits of the values the rows decode to (apps.receipts.commitment's sketch layout),
    1 <= k <= d_model. ValueError on a wrong byte count."""
    row_bytes = -(-d_model // Q8_BLOCK) * Q8_BLOCK_BYTES
    if len(data) != tokens * row_bytes:
        raise ValueError(f"Q8_0 rows [{tokens}, {d_model}] need {tokens * row_bytes} bytes, got {len(data)}")
    return sketch_q8_0_parts([data], d_model=d_model, k=k, variant=variant)[0]


def sketch_q8_0_parts(parts: Sequence[bytes | bytearray | memoryview], *, d_model: int, k: int, variant: str = ""
                      ) -> tuple[np.ndarray, tuple[bool | None, ...]]:
    """Several answers' Q8_0 rows sketched in one call: uint32 [all rows, 2k], the parts' rows one
    after another, and per part whether its block scales are all finite (its rows are finite exactly
    then; None where the numba kernel ran, which does not say). ValueError on a part that is not whole rows.

    The C extension (apps/receipts/_q8_sketch.c: the same passes, ~5x faster) when it was built, its
    best variant unless `variant` names one ("avx2", "scalar", or "numba" for this module's kernel)."""
    row_bytes = -(-d_model // Q8_BLOCK) * Q8_BLOCK_BYTES
    rows = 0
    for i, part in enumerate(parts):
        if len(part) % row_bytes:
            raise ValueError(f"answer {i} has {len(part)} bytes, not whole Q8_0 rows of {row_bytes}")
        rows += len(part) // row_bytes
    if _q8_sketch is not None and variant != "numba":
        out = np.empty((rows, 2 * k), dtype=np.uint32)
        return out, _q8_sketch.sketch_q8_0(parts, d_model, k, F16_TO_F32, out, variant)
    sketches = [_sketch_q8_0(np.frombuffer(part, dtype=np.uint8).reshape(-1, row_bytes), d_model, k, F16_TO_F32)
                for part in parts]
    return (np.concatenate(sketches) if sketches else np.empty((0, 2 * k), np.uint32)), (None,) * len(parts)
