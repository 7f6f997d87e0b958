"""Numba kernels that read raw GGML blocks directly (no whole-matrix dequantize per call).

Each format has one block decoder, used two ways, both parallel over output rows (each row
is owned by one thread, so writes to `y[:, o]` and `out[o - r0]` never race):

* ``*_matmul(w, x, lut, y)`` — fused: y[t, m] = x[t, n] · dequant(w)[m, n]ᵀ. Per row, each
  block is decoded once into a small f32 scratch that stays in L1 and is dotted with every
  token, so the weights stream from memory exactly once per call. A batch-1 expert is
  memory-bound, and these formats read 4–7x fewer bytes than f32.
* ``*_dequant_rows(w, r0, lut, out)`` — decode rows r0 .. r0+len(out) into an f32 tile, for
  the large-batch path (tile then sgemm, see backends.py).

Why the code looks the way it does: LLVM only vectorizes these loops when every index is a
plain offset into a 1-D C-contiguous view (`w[o]`, `x[tt]`); multi-dimensional indexing
or strided slices fall back to scalar code (measured ~3x slower). Dot products accumulate
into a 32/256-lane `acc` reduced once per row, instead of a horizontal sum per block.
fastmath lets LLVM reorder f32 sums; results agree with an f64 reference to ~1e-6.

`w` is u8 [m, row_bytes] (C-contiguous blocks exactly as in a GGUF tensor); `x` f32 [t, n]
C-contiguous; `lut` f32[65536] maps raw f16 bits to f32 (exact; numba has no f16).

Block layouts (ggml-common.h):

    block_q8_0 (34 B / 32):  d:f16 | qs:i8[32]                       w = d*q
    block_q4_K (144 B/256):  d:f16 | dmin:f16 | scales:u8[12] | qs:u8[128]
        8 sub-blocks of 32; sub-blocks 2j / 2j+1 use the low / high nibbles of qs[32j:32j+32]
        6-bit (scale, min) pairs packed in scales[12]:
            bytes 0-3:  mm|ssssss  (scale j, top 2 bits of scale j+4)      j = 0..3
            bytes 4-7:  mm|mmmmmm  (min j,   top 2 bits of min j+4)
            bytes 8-11: mmmm|ssss  (low 4 bits of min j+4 | scale j+4)
        w = d*scale*q - dmin*min
    block_q6_K (210 B/256):  ql:u8[128] | qh:u8[64] | scales:i8[16] | d:f16
        halves h=0,1 of 128; element r of a half (l = r % 32, quarter = r // 32):
            low 4 bits  ql[64h + l + 32*(quarter & 1)] >> (4 * (quarter >> 1))
            high 2 bits (qh[32h + l] >> 2*quarter) & 3
        w = d * scales[8h + r // 16] * (q - 32)
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

Q8_0_BYTES = 34
Q4_K_BYTES = 144
Q6_K_BYTES = 210

_JIT = {"parallel": True, "fastmath": True, "cache": True, "nogil": True}
_INLINE = {"inline": "always", "fastmath": True, "cache": True}


def f16_lut() -> np.ndarray:
    """f32[65536]: every f16 bit pattern as f32 (NaN/inf map through as NaN/inf)."""
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@numba.njit(**_INLINE)
def _half(wr: np.ndarray, at: int, lut: np.ndarray) -> np.float32:
    return lut[np.int64(wr[at]) | (np.int64(wr[at + 1]) << 8)]


# --- block decoders: row view `wr`, block byte offset `base` -> out[off : off + block] ---------


@numba.njit(**_INLINE)
def _decode_q8_0(wr: np.ndarray, base: int, lut: np.ndarray, out: np.ndarray, off: int) -> None:
    d = _half(wr, base, lut)
    q0 = base + 2
    for i in range(32):
        out[off + i] = d * np.float32(np.int8(wr[q0 + i]))  # the u8 byte reinterpreted as i8


@numba.njit(**_INLINE)
def _decode_q4_k(wr: np.ndarray, base: int, lut: np.ndarray, out: np.ndarray, off: int) -> None:
    d = _half(wr, base, lut)
    dmin = _half(wr, base + 2, lut)
    s = base + 4
    for j in range(4):
        # sub-blocks 2j and 2j+1: unpack their 6-bit scale and min (see the diagram above)
        lo, hi = 2 * j, 2 * j + 1
        if lo < 4:
            sc0, m0 = np.int32(wr[s + lo]) & 63, np.int32(wr[s + lo + 4]) & 63
        else:
            b = np.int32(wr[s + lo + 4])
            sc0 = (b & 15) | ((np.int32(wr[s + lo - 4]) >> 6) << 4)
            m0 = (b >> 4) | ((np.int32(wr[s + lo]) >> 6) << 4)
        if hi < 4:
            sc1, m1 = np.int32(wr[s + hi]) & 63, np.int32(wr[s + hi + 4]) & 63
        else:
            b = np.int32(wr[s + hi + 4])
            sc1 = (b & 15) | ((np.int32(wr[s + hi - 4]) >> 6) << 4)
            m1 = (b >> 4) | ((np.int32(wr[s + hi]) >> 6) << 4)
        a0, c0 = d * np.float32(sc0), dmin * np.float32(m0)
        a1, c1 = d * np.float32(sc1), dmin * np.float32(m1)
        qs = base + 16 + 32 * j
        o = off + 64 * j
        for i in range(32):
            q = np.int32(wr[qs + i])
            out[o + i] = a0 * np.float32(q & 15) - c0
            out[o + 32 + i] = a1 * np.float32(q >> 4) - c1


@numba.njit(**_INLINE)
def _decode_q6_k(wr: np.ndarray, base: int, lut: np.ndarray, out: np.ndarray, off: int) -> None:
    d = _half(wr, base + 208, lut)
    for h in range(2):
        ql = base + 64 * h
        qh = base + 128 + 32 * h
        sc = base + 192 + 8 * h
        o = off + 128 * h
        for half in range(2):  # elements 16*half .. 16*half+15 of each quarter share a scale
            s0 = d * np.float32(np.int8(wr[sc + half]))
            s1 = d * np.float32(np.int8(wr[sc + half + 2]))
            s2 = d * np.float32(np.int8(wr[sc + half + 4]))
            s3 = d * np.float32(np.int8(wr[sc + half + 6]))
            for i in range(16):
                ll = 16 * half + i
                lo0 = np.int32(wr[ql + ll])
                lo1 = np.int32(wr[ql + 32 + ll])
                hb = np.int32(wr[qh + ll])
                out[o + ll] = s0 * np.float32(((lo0 & 15) | ((hb & 3) << 4)) - 32)
                out[o + 32 + ll] = s1 * np.float32(((lo1 & 15) | (((hb >> 2) & 3) << 4)) - 32)
                out[o + 64 + ll] = s2 * np.float32(((lo0 >> 4) | (((hb >> 4) & 3) << 4)) - 32)
                out[o + 96 + ll] = s3 * np.float32(((lo1 >> 4) | (((hb >> 6) & 3) << 4)) - 32)


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


@numba.njit(**_JIT)
def q4_k_matmul(w: np.ndarray, x: np.ndarray, lut: np.ndarray, y: np.ndarray) -> None:
    m = w.shape[0]
    t, n = x.shape
    for o in prange(m):
        wr = w[o]
        wf = np.empty(256, dtype=np.float32)
        acc = np.zeros((t, 256), dtype=np.float32)
        for b in range(n // 256):
            _decode_q4_k(wr, b * Q4_K_BYTES, lut, wf, 0)
            _dot_block(wf, x, b * 256, acc, 256)
        for tt in range(t):
            y[tt, o] = acc[tt].sum()


@numba.njit(**_JIT)
def q6_k_matmul(w: np.ndarray, x: np.ndarray, lut: np.ndarray, y: np.ndarray) -> None:
    m = w.shape[0]
    t, n = x.shape
    for o in prange(m):
        wr = w[o]
        wf = np.empty(256, dtype=np.float32)
        acc = np.zeros((t, 256), dtype=np.float32)
        for b in range(n // 256):
            _decode_q6_k(wr, b * Q6_K_BYTES, lut, wf, 0)
            _dot_block(wf, x, b * 256, acc, 256)
        for tt in range(t):
            y[tt, o] = acc[tt].sum()


# --- row-tile dequantizers ----------------------------------------------------------------------


@numba.njit(**_JIT)
def q8_0_dequant_rows(w: np.ndarray, r0: int, lut: np.ndarray, out: np.ndarray) -> None:
    for r in prange(out.shape[0]):
        wr, orow = w[r0 + r], out[r]
        for b in range(out.shape[1] // 32):
            _decode_q8_0(wr, b * Q8_0_BYTES, lut, orow, b * 32)


@numba.njit(**_JIT)
def q4_k_dequant_rows(w: np.ndarray, r0: int, lut: np.ndarray, out: np.ndarray) -> None:
    for r in prange(out.shape[0]):
        wr, orow = w[r0 + r], out[r]
        for b in range(out.shape[1] // 256):
            _decode_q4_k(wr, b * Q4_K_BYTES, lut, orow, b * 256)


@numba.njit(**_JIT)
def q6_k_dequant_rows(w: np.ndarray, r0: int, lut: np.ndarray, out: np.ndarray) -> None:
    for r in prange(out.shape[0]):
        wr, orow = w[r0 + r], out[r]
        for b in range(out.shape[1] // 256):
            _decode_q6_k(wr, b * Q6_K_BYTES, lut, orow, b * 256)


MATMUL = {"Q8_0": q8_0_matmul, "Q4_K": q4_k_matmul, "Q6_K": q6_k_matmul}
DEQUANT_ROWS = {"Q8_0": q8_0_dequant_rows, "Q4_K": q4_k_dequant_rows, "Q6_K": q6_k_dequant_rows}
BLOCK = {"Q8_0": (32, Q8_0_BYTES), "Q4_K": (256, Q4_K_BYTES), "Q6_K": (256, Q6_K_BYTES)}
