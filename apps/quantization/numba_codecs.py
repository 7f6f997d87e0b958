"""Optional numba kernels for the hot paths (decode of every block type, Q8_0 encode).

The numpy kernels in q8_0/q4_k/q6_k are the reference; these compute the same
f32 products in the same order, so results are bit-identical, which the tests check.  (LLVM
may contract a multiply followed by a subtract into an FMA even without fastmath; the
Q4_K kernel routes its product through an exact f64 multiply to prevent that.)  We run
serially: on this 2-core node numba's thread pool cost more than it saved.  f16 fields
are widened through a lookup table (numba has no f16).

Compiled lazily on first use and cached on disk (`cache=True`); set
TENZRO_QUANT_JIT=0 to force the numpy path.  Without numba everything still works.
"""

from __future__ import annotations

import os

import numpy as np

try:  # pragma: no cover - exercised implicitly when numba is installed
    import numba
except ImportError:  # pragma: no cover
    numba = None

ENABLED = numba is not None and os.environ.get("TENZRO_QUANT_JIT", "1") != "0"


# Every f16 bit pattern widened to f32 (exact), indexed by the little-endian u16: numba
# has no f16 type, and a 256 KiB table lookup per block is cheaper than a numpy pass.
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def enabled() -> bool:
    return ENABLED


def set_enabled(flag: bool) -> None:
    """Switch the JIT path on or off (tests compare both)."""
    global ENABLED
    ENABLED = bool(flag) and numba is not None


if numba is not None:
    _jit = numba.njit(cache=True, nogil=True, boundscheck=False)

    @_jit
    def dequant_q8_0(blocks, f16, out):  # blocks (n, 34) u8, f16 LUT (65536,) f32, out (n, 32)
        for b in range(blocks.shape[0]):
            db = f16[np.int32(blocks[b, 0]) | (np.int32(blocks[b, 1]) << 8)]
            for i in range(32):
                out[b, i] = np.float32(np.int8(blocks[b, 2 + i])) * db

    @_jit
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

    @_jit
    def dequant_q4_k(blocks, f16, out):  # blocks (n, 144) u8, f16 LUT, out (n, 256) f32
        for b in range(blocks.shape[0]):
            d = f16[np.int32(blocks[b, 0]) | (np.int32(blocks[b, 1]) << 8)]
            dmin = f16[np.int32(blocks[b, 2]) | (np.int32(blocks[b, 3]) << 8)]
            for j in range(8):
                if j < 4:
                    sc = blocks[b, 4 + j] & 63
                    m = blocks[b, 8 + j] & 63
                else:
                    sc = (blocks[b, 8 + j] & 0xF) | ((blocks[b, j] >> 6) << 4)
                    m = (blocks[b, 8 + j] >> 4) | ((blocks[b, 4 + j] >> 6) << 4)
                dl = d * np.float32(sc)
                ml = dmin * np.float32(m)
                base = 16 + 32 * (j >> 1)
                shift = 4 * (j & 1)
                for i in range(32):
                    q = (blocks[b, base + i] >> shift) & 0xF
                    # The f64 product of an f32 and a 4-bit int is exact, so rounding it to
                    # f32 equals the f32 product; going through f64 stops LLVM from fusing
                    # the multiply and subtract into an FMA, which would round differently
                    # from GGUF's numpy decoder.
                    prod = np.float32(np.float64(dl) * np.float64(q))
                    out[b, 32 * j + i] = prod - ml

    @_jit
    def dequant_q6_k(blocks, f16, out):  # blocks (n, 210) u8, f16 LUT, out (n, 256) f32
        for b in range(blocks.shape[0]):
            d = f16[np.int32(blocks[b, 208]) | (np.int32(blocks[b, 209]) << 8)]
            for h in range(2):
                for k in range(4):
                    ql_base = 64 * h + 32 * (k & 1)
                    ql_shift = 4 * (k >> 1)
                    qh_shift = 2 * k
                    for half in range(2):
                        j = 8 * h + 2 * k + half
                        dl = d * np.float32(np.int8(blocks[b, 192 + j]))
                        for li in range(16):
                            ll = 16 * half + li
                            lo = (blocks[b, ql_base + ll] >> ql_shift) & 0xF
                            hi = (blocks[b, 128 + 32 * h + ll] >> qh_shift) & 3
                            q = np.int32(lo | (hi << 4)) - 32
                            out[b, 128 * h + 32 * k + ll] = dl * np.float32(q)
