"""Numba block codecs: one decoder per block format, and the Q8_0 encoder.

Block decoders (inlined into every caller, `inline="always"`):

    decode_<fmt>(w, base, lut, out, off)
        w     u8 1-D C-contiguous view holding the block at byte offset `base`
        lut   f32[65536], core.quantization.f16.F16_TO_F32 (numba has no f16 type)
        out   f32 1-D, the block's values are written to out[off : off + block_size]

They are used two ways: by the whole-array kernels below (`dequant_<fmt>`, the compiled
path of core.quantization.registry.dequantize) and by the expert matmuls in
core.experts.numba_matmul, which decode a block into a scratch in L1 and dot it with the
activations.  An inlined function is compiled with its *caller's* flags: the kernels here
and numba_matmul's dequant_rows run without fastmath, so every product and difference is
rounded separately, as gguf-py's numpy decoder does (`(d*sc)*q - dmin*m` is two roundings;
an FMA would be one), and their output is bit-identical to it, which the tests check.  The
matmuls run with fastmath and may fuse; their result is checked against an f64 reference.

Block layouts: core/quantization/q8_0.py, q4_k.py, q6_k.py (ggml-common.h byte for byte).
The numpy kernels in q8_0/q4_k/q6_k are the reference.  We run serially here: on a 2-core
node numba's thread pool cost more than it saved (numba_matmul's kernels are parallel over
output rows instead).

Compiled lazily on first use and cached on disk (`cache=True`); TENZRO_QUANT_JIT=0 forces
the numpy path.  Without numba everything still works (the names below are then missing).
"""

from __future__ import annotations

import os

import numpy as np

try:  # pragma: no cover - exercised implicitly when numba is installed
    import numba
except ImportError:  # pragma: no cover
    numba = None

ENABLED = numba is not None and os.environ.get("TENZRO_QUANT_JIT", "1") != "0"


def enabled() -> bool:
    return ENABLED


def set_enabled(flag: bool) -> None:
    """Switch the JIT path on or off (tests compare both)."""
    global ENABLED
    ENABLED = bool(flag) and numba is not None


if numba is not None:
    _inline = numba.njit(inline="always", cache=True, nogil=True, boundscheck=False)
    _kernel = numba.njit(cache=True, nogil=True, boundscheck=False)

    @_inline
    def _half(w, at, lut):  # the little-endian f16 at byte `at` of w, as f32
        return lut[np.int64(w[at]) | (np.int64(w[at + 1]) << 8)]

    # --- block decoders -------------------------------------------------------------------

    @_inline
    def decode_q8_0(w, base, lut, out, off):  # 34 bytes -> 32 values: d * q
        d = _half(w, base, lut)
        q0 = base + 2
        for i in range(32):
            out[off + i] = d * np.float32(np.int8(w[q0 + i]))  # the u8 byte reinterpreted as i8

    @_inline
    def decode_q4_k(w, base, lut, out, off):  # 144 bytes -> 256 values: (d*sc)*q - dmin*m
        d = _half(w, base, lut)
        dmin = _half(w, base + 2, lut)
        s = base + 4
        for j in range(4):
            # sub-blocks 2j and 2j+1 share qs[32j : 32j+32] (low / high nibbles); unpack their
            # 6-bit scale and min (layout in q4_k.py)
            lo, hi = 2 * j, 2 * j + 1
            if lo < 4:
                sc0, m0 = np.int32(w[s + lo]) & 63, np.int32(w[s + lo + 4]) & 63
            else:
                b = np.int32(w[s + lo + 4])
                sc0 = (b & 15) | ((np.int32(w[s + lo - 4]) >> 6) << 4)
                m0 = (b >> 4) | ((np.int32(w[s + lo]) >> 6) << 4)
            if hi < 4:
                sc1, m1 = np.int32(w[s + hi]) & 63, np.int32(w[s + hi + 4]) & 63
            else:
                b = np.int32(w[s + hi + 4])
                sc1 = (b & 15) | ((np.int32(w[s + hi - 4]) >> 6) << 4)
                m1 = (b >> 4) | ((np.int32(w[s + hi]) >> 6) << 4)
            a0, c0 = d * np.float32(sc0), dmin * np.float32(m0)
            a1, c1 = d * np.float32(sc1), dmin * np.float32(m1)
            qs = base + 16 + 32 * j
            o = off + 64 * j
            for i in range(32):
                q = np.int32(w[qs + i])
                out[o + i] = a0 * np.float32(q & 15) - c0
                out[o + 32 + i] = a1 * np.float32(q >> 4) - c1

    @_inline
    def decode_q6_k(w, base, lut, out, off):  # 210 bytes -> 256 values: (d*sc)*(q - 32)
        d = _half(w, base + 208, lut)
        for h in range(2):
            ql = base + 64 * h
            qh = base + 128 + 32 * h
            sc = base + 192 + 8 * h
            o = off + 128 * h
            for half in range(2):  # values 16*half .. 16*half+15 of each quarter share a scale
                s0 = d * np.float32(np.int8(w[sc + half]))
                s1 = d * np.float32(np.int8(w[sc + half + 2]))
                s2 = d * np.float32(np.int8(w[sc + half + 4]))
                s3 = d * np.float32(np.int8(w[sc + half + 6]))
                for i in range(16):
                    ll = 16 * half + i
                    lo0 = np.int32(w[ql + ll])
                    lo1 = np.int32(w[ql + 32 + ll])
                    hb = np.int32(w[qh + ll])
                    out[o + ll] = s0 * np.float32(((lo0 & 15) | ((hb & 3) << 4)) - 32)
                    out[o + 32 + ll] = s1 * np.float32(((lo1 & 15) | (((hb >> 2) & 3) << 4)) - 32)
                    out[o + 64 + ll] = s2 * np.float32(((lo0 >> 4) | (((hb >> 4) & 3) << 4)) - 32)
                    out[o + 96 + ll] = s3 * np.float32(((lo1 >> 4) | (((hb >> 6) & 3) << 4)) - 32)

    # --- whole-array kernels: blocks (n_blocks, type_size) u8 -> out (n_blocks, block_size) f32

    @_kernel
    def dequant_q8_0(blocks, lut, out):
        for b in range(blocks.shape[0]):
            decode_q8_0(blocks[b], 0, lut, out[b], 0)

    @_kernel
    def dequant_q4_k(blocks, lut, out):
        for b in range(blocks.shape[0]):
            decode_q4_k(blocks[b], 0, lut, out[b], 0)

    @_kernel
    def dequant_q6_k(blocks, lut, out):
        for b in range(blocks.shape[0]):
            decode_q6_k(blocks[b], 0, lut, out[b], 0)

    @_kernel
    def quant_q8_0(x, d_out, qs_out):  # x (n, 32) f32 -> d (n,) f32, qs (n, 32) i8
        for b in range(x.shape[0]):
            amax = np.float32(0)
            for i in range(32):
                a = abs(x[b, i])
                if a > amax:
                    amax = a
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d != 0 else np.float32(0)
            if inv == np.inf:  # amax < ~1e-36: see Q8_0.quantize_blocks
                inv = np.float32(0)
            d_out[b] = d
            for i in range(32):
                v = x[b, i] * inv
                t = np.float32(np.trunc(v))
                r = t + np.float32(np.trunc((v - t) * np.float32(2)))  # C roundf
                qs_out[b, i] = np.int8(r)
