"""Numba kernels that read raw GGML blocks directly (no whole-matrix dequantize per call).

Each format has one block decoder, used two ways, both parallel over output rows (each row
is owned by one thread, so writes to `y[:, o]` and `out[o - r0]` never race):

* ``*_matmul(w, x, lut, y)`` — fused: y[t, m] = x[t, n] · dequant(w)[m, n]ᵀ. Per row, each
  block is decoded once into a small f32 scratch that stays in L1 and is dotted with every
  token, so the weights stream from memory exactly once per call. A batch-1 expert is
  memory-bound, and these formats read 4–7x fewer bytes than f32.
* ``*_dequant_rows(w, r0, lut, out)`` — decode rows r0 .. r0+len(out) into an f32 tile, for
  the large-batch path (tile then sgemm, see backends.py).

The K-quant matmuls and every row dequantizer come from one factory each, specialised by the
block decoder (numba compiles each closure with its decoder inlined, as if written out).

Why the code looks the way it does: LLVM only vectorizes these loops when every index is a
plain offset into a 1-D C-contiguous view (`w[o]`, `x[tt]`); multi-dimensional indexing
or strided slices fall back to scalar code (measured ~3x slower). Dot products accumulate
into a 32/256-lane `acc` reduced once per row, instead of a horizontal sum per block.
fastmath lets LLVM reorder f32 sums; results agree with an f64 reference to ~1e-6.

`w` is u8 [m, row_bytes] (C-contiguous blocks exactly as in a GGUF tensor); `x` f32 [t, n]
C-contiguous; `lut` is core.quantization.f16.F16_TO_F32. The block decoders are
core.quantization.numba_codecs' (layouts in core/quantization/q8_0.py, q4_k.py, q6_k.py),
inlined here: the matmuls compile them with fastmath, the row dequantizers without, so the
tiles stay bit-identical to gguf's decoder. MXFP4's decoder (layout in core/quantization/mxfp4.py)
is the one defined here, on two lookup tables frozen into the kernels as constants.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import prange

from core.quantization.mxfp4 import KVALUES, e8m0_to_fp32_half
from core.quantization.numba_codecs import decode_q4_k, decode_q6_k, decode_q8_0
from core.quantization.types import GGMLType

Q8_0_BYTES = GGMLType.Q8_0.type_size
Q4_K_BYTES = GGMLType.Q4_K.type_size
Q6_K_BYTES = GGMLType.Q6_K.type_size
MXFP4_BYTES = GGMLType.MXFP4.type_size
# MXFP4: code -> value (f32[16]) and E8M0 exponent -> block scale 2^(e - 128) (f32[256], ggml's
# subnormals for e 0 and 1 included), read by numba as compile-time constant arrays
_MXFP4_VALUES = KVALUES.astype(np.float32)
_E8M0_HALF = e8m0_to_fp32_half(np.arange(256, dtype=np.uint8))

_JIT = {"parallel": True, "fastmath": True, "cache": True, "nogil": True}
# Row dequantizers: no fastmath, so the inlined decoders round like gguf's (see above).
_EXACT = {"parallel": True, "cache": True, "nogil": True}
_INLINE = {"inline": "always", "fastmath": True, "cache": True}


@numba.njit(inline="always", cache=True, nogil=True)  # the caller's fastmath (or not) applies once inlined
def decode_mxfp4(w: np.ndarray, base: int, lut: np.ndarray, out: np.ndarray, off: int) -> None:
    """17 bytes at w[base] -> 32 values at out[off]: d·KVALUES[code], code i in the low nibble of
    byte 1 + i, code i + 16 in its high nibble. `lut` (the f16 table) is unused: the common
    decoder signature. One f32 product per value, so exact wherever inlined without fastmath."""
    d = _E8M0_HALF[w[base]]
    for i in range(16):
        q = w[base + 1 + i]
        out[off + i] = d * _MXFP4_VALUES[q & 15]
        out[off + 16 + i] = d * _MXFP4_VALUES[q >> 4]


# --- fused matmuls ------------------------------------------------------------------------------


@numba.njit(**_INLINE)
def _dot_block(wf: np.ndarray, x: np.ndarray, xb: int, acc: np.ndarray, size: int) -> None:
    """acc[tt, :size] += wf[:size] * x[tt, xb : xb + size] for every token tt."""
    for tt in range(x.shape[0]):
        xr = x[tt]
        a = acc[tt]
        for i in range(size):
            a[i] += wf[i] * xr[xb + i]


@numba.njit(**_JIT)
def q8_0_matmul(w: np.ndarray, x: np.ndarray, lut: np.ndarray, y: np.ndarray) -> None:
    """`w` is the u8 block array viewed as int8 (`w.view(np.int8)`, no copy): LLVM vectorizes
    the i8 -> f32 widening of a signed array, not a per-element u8 -> i8 cast (~4x slower).
    Q8_0's 32-value blocks are too short for the decode-then-dot scheme of the K-quants (the
    per-block loop overhead dominated), so its dot is fused into the decode."""
    m = w.shape[0]
    t, n = x.shape
    for o in prange(m):
        qr = w[o]
        acc = np.zeros((t, 32), dtype=np.float32)
        for b in range(n // 32):
            base = b * Q8_0_BYTES
            d = lut[(np.int64(qr[base]) & 255) | ((np.int64(qr[base + 1]) & 255) << 8)]
            for tt in range(t):
                xr = x[tt]
                a = acc[tt]
                for i in range(32):
                    a[i] += d * np.float32(qr[base + 2 + i]) * xr[b * 32 + i]
        for tt in range(t):
            y[tt, o] = acc[tt].sum()


def _decoded_matmul(decode: Any, block_bytes: int, block_values: int) -> Any:
    """The fused matmul of a format whose blocks are decoded by `decode` into a scratch row, then
    dotted with every token: the K-quants (256 values) and MXFP4 (32; its table lookups do not fuse
    into the dot the way Q8_0's int8 widening does). They differ only in the decoder."""

    @numba.njit(**_JIT)
    def matmul(w: np.ndarray, x: np.ndarray, lut: np.ndarray, y: np.ndarray) -> None:
        m = w.shape[0]
        t, n = x.shape
        for o in prange(m):
            wr = w[o]
            wf = np.empty(block_values, dtype=np.float32)
            acc = np.zeros((t, block_values), dtype=np.float32)
            for b in range(n // block_values):
                decode(wr, b * block_bytes, lut, wf, 0)
                _dot_block(wf, x, b * block_values, acc, block_values)
            for tt in range(t):
                y[tt, o] = acc[tt].sum()

    return matmul


q4_k_matmul = _decoded_matmul(decode_q4_k, Q4_K_BYTES, 256)
q6_k_matmul = _decoded_matmul(decode_q6_k, Q6_K_BYTES, 256)
mxfp4_matmul = _decoded_matmul(decode_mxfp4, MXFP4_BYTES, 32)


# --- row-tile dequantizers ----------------------------------------------------------------------


def _dequant_rows(decode: Any, block_bytes: int, block_values: int) -> Any:
    """Rows r0 .. r0+len(out) of a block format decoded by `decode` into the f32 tile `out`."""

    @numba.njit(**_EXACT)
    def dequant_rows(w: np.ndarray, r0: int, lut: np.ndarray, out: np.ndarray) -> None:
        for r in prange(out.shape[0]):
            wr, orow = w[r0 + r], out[r]
            for b in range(out.shape[1] // block_values):
                decode(wr, b * block_bytes, lut, orow, b * block_values)

    return dequant_rows


q8_0_dequant_rows = _dequant_rows(decode_q8_0, Q8_0_BYTES, 32)
q4_k_dequant_rows = _dequant_rows(decode_q4_k, Q4_K_BYTES, 256)
q6_k_dequant_rows = _dequant_rows(decode_q6_k, Q6_K_BYTES, 256)
mxfp4_dequant_rows = _dequant_rows(decode_mxfp4, MXFP4_BYTES, 32)


MATMUL = {"Q8_0": q8_0_matmul, "Q4_K": q4_k_matmul, "Q6_K": q6_k_matmul, "MXFP4": mxfp4_matmul}
DEQUANT_ROWS = {"Q8_0": q8_0_dequant_rows, "Q4_K": q4_k_dequant_rows, "Q6_K": q6_k_dequant_rows,
                "MXFP4": mxfp4_dequant_rows}
