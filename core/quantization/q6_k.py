"""Q6_K: 256-weight super-blocks of 16 sub-blocks x 16, int8 scales (210 bytes, 6.5625 bpw).

    byte 0                 128              192          208   210
         +-----------------+----------------+------------+-----+
         | ql[128]         | qh[64]         | scales[16] |  d  |
         | low 4 bits      | high 2 bits    | int8       | f16 |
         +-----------------+----------------+------------+-----+

    x[16*j + i] = d * scales[j] * (q - 32)        (q in 0..63, j = sub-block 0..15)

  Each half h (128 weights, q[128h + 32k + l], k = 0..3, l = 0..31) uses
  ql[64h .. 64h+63] and qh[32h .. 32h+31]:

    ql[64h + l]      = q[.. 0*32 + l] & 0xF  |  (q[.. 2*32 + l] & 0xF) << 4
    ql[64h + 32 + l] = q[.. 1*32 + l] & 0xF  |  (q[.. 3*32 + l] & 0xF) << 4
    qh[32h + l]      = q0 >> 4 | (q1 >> 4) << 2 | (q2 >> 4) << 4 | (q3 >> 4) << 6
                       bits: 76 54 32 10 = q3h q2h q1h q0h

Scale choice follows llama.cpp's quantize_row_q6_K_ref: per 16-weight sub-block
make_qx_quants (nmax 32, weights x^2, 19 candidate scales -(32 + 0.1*k)/max), then the 16
sub-block scales are quantized to int8 against the one with the largest magnitude, and
the quants recomputed from the stored (f16 x int8) scales.

Two encoders, the same bytes.  The C extension (core.quantization.kquant_c, the default
when built) and the numpy encoder below both do llama.cpp's quantize_row_q6_K_ref in f32,
operation for operation in the C order (sums index by index from 0, nearest_int's bit
trick); an all-zero sub-block keeps quants 0 (not 32) and a sub-block whose stored scale is
0 keeps the search's quants, as in the reference.  The tests compare both encoders with
llama.cpp's golden hashes and with each other byte for byte.

The numpy search works on x transposed to (16, n_sub) (row i: value i of every sub-block);
the only Python loops are over the 16 indices and the 19 candidate scales.
"""

from __future__ import annotations

import numpy as np

from . import kquant_c, numba_codecs
from .blocks import BlockKernel, nearest_int, sum_in_order
from .f16 import F16_TO_F32, f16_bits_to_f32
from .types import GGMLType

_NSUB, _SUB = 16, 16
GROUP_MAX_EPS = np.float32(1e-15)  # llama.cpp: a sub-block (or super-block) with a smaller max is zero


def make_qx_quants(xt: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's make_qx_quants, rmse_type 1 (weights x^2), for every sub-block, in C's f32 order.

    xt: f32 (n, n_sub), value i of sub-block s at [i, s].  Returns the signed scale (n_sub,) f32
    (< 0 when the largest-magnitude value is positive, as in llama.cpp) and L (n, n_sub) int32
    in 0..2*nmax-1 (l + nmax), with x ~= scale * (L - nmax).
    """
    f32 = np.float32
    n_sub = xt.shape[1]
    amax, vmax = np.zeros(n_sub, f32), np.zeros(n_sub, f32)
    for i in range(xt.shape[0]):  # strict '>': the first largest magnitude wins, as in C
        ax = np.abs(xt[i])
        bigger = ax > amax
        np.copyto(amax, ax, where=bigger)
        np.copyto(vmax, xt[i], where=bigger)
    zero = amax < GROUP_MAX_EPS  # the reference returns scale 0 and L 0 here
    with np.errstate(over="ignore"):  # |x| > 1.8e19: inf, as in C (the f16 scale overflows anyway)
        w = xt * xt
        wx = w * xt
    v = np.empty(xt.shape, f32)  # scratch reused by every candidate
    terms = np.empty((xt.shape[0], 2, n_sub), f32)  # per index: w*x*l, w*l*l

    def search(iscale: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """out = clamp(nearest_int(iscale * x), -nmax, nmax-1) + nmax (int32); (sumlx, suml2)."""
        nearest_int(np.multiply(xt, iscale, out=v), out=out)
        np.clip(out, -nmax, nmax - 1, out=out)
        np.copyto(v, out)  # l as f32
        np.multiply(wx, v, out=terms[:, 0])
        np.multiply(np.multiply(w, v, out=terms[:, 1]), v, out=terms[:, 1])
        out += nmax
        sumlx, suml2 = sum_in_order(terms)
        return sumlx, suml2

    L = np.empty(xt.shape, np.int32)
    la = np.empty(xt.shape, np.int32)
    with np.errstate(all="ignore"):  # zero sub-blocks divide by 0; they are masked at the end
        sumlx, suml2 = search(f32(-nmax) / vmax, L)
        scale = np.where(suml2 != 0, sumlx / suml2, f32(0))
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            sumlx, suml2 = search(-(f32(nmax) + f32(0.1) * f32(step)) / vmax, la)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            np.copyto(L, la, where=better)
            np.copyto(scale, sumlx / suml2, where=better)
            np.copyto(best, scale * sumlx, where=better)
    L[:, zero] = 0
    scale[zero] = 0
    return scale, L


class Q6_K(BlockKernel, ggml_type=GGMLType.Q6_K):
    # 1024 blocks per numpy call: the search's per-index Python loop runs ~1000 numpy calls per
    # chunk; measured ~40% faster than 256 blocks at Q4_K, slower again at 4096 (out of L2)
    quantize_chunk = 1 << 18

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == 256 and blocks.dtype == np.float32
        n_blocks = blocks.shape[0]
        xt = np.ascontiguousarray(blocks.reshape(n_blocks * _NSUB, _SUB).T)  # (16, n_sub)
        scales, L = make_qx_quants(xt, 32)
        return cls.encode(blocks.reshape(n_blocks, _NSUB, _SUB), scales.reshape(n_blocks, _NSUB),
                          L.T.reshape(n_blocks, _NSUB, _SUB))

    @classmethod
    def encode(cls, x: np.ndarray, scales: np.ndarray, L: np.ndarray | None = None) -> np.ndarray:
        """Pack x (n_blocks, 16, 16) given signed per-sub-block scales (n_blocks, 16) f32.

        L (n_blocks, 16, 16) int in 0..63, the search's quants, is kept where a stored scale
        is 0 (as the reference does); None means zeros.
        """
        n_blocks = x.shape[0]
        f32 = np.float32
        max_abs = np.zeros(n_blocks, f32)  # the running |max| from 0 and its signed scale
        max_scale = np.zeros(n_blocks, f32)
        for j in range(_NSUB):
            a = np.abs(scales[:, j])
            bigger = a > max_abs
            np.copyto(max_abs, a, where=bigger)
            np.copyto(max_scale, scales[:, j], where=bigger)
        empty = max_abs < GROUP_MAX_EPS  # llama.cpp zeroes the whole block
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            iscale = f32(-128) / max_scale
            d16 = (f32(1) / iscale).astype("<f2")  # inf here is reported by the registry
            sc = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)  # (n_blocks, 16)
            d_sub = (d16.astype(f32)[:, None] * sc.astype(f32))[..., None]  # (n_blocks, 16, 1)
            q = np.clip(nearest_int(x / d_sub), -32, 31) + 32
        if L is None:
            L = np.zeros(q.shape, np.int32)
        q = np.where(d_sub != 0, q, L).astype(np.uint8).reshape(n_blocks, 2, 4, 32)  # (n_blocks, half, k, l)

        out = np.empty((n_blocks, cls.type_size), dtype=np.uint8)
        lo = q & np.uint8(0x0F)
        out[:, 0:128].reshape(n_blocks, 2, 2, 32)[:] = lo[:, :, 0:2] | (lo[:, :, 2:4] << 4)
        hi = q >> 4
        out[:, 128:192].reshape(n_blocks, 2, 32)[:] = (
            hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
        )
        out[:, 192:208] = sc.view(np.uint8)
        out[:, 208:210] = d16.view(np.uint8).reshape(n_blocks, 2)
        out[empty] = 0  # d = +0.0 in f16 is all zero bits too
        return out

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == cls.type_size and blocks.dtype == np.uint8
        n_blocks = blocks.shape[0]
        if out is None:
            out = np.empty((n_blocks, 256), dtype=np.float32)
        d = f16_bits_to_f32(blocks[:, 208:210])  # (n_blocks, 1)
        d_sub = (d * blocks[:, 192:208].view(np.int8)).reshape(n_blocks, 2, 4, 2, 1)  # f32
        ql = blocks[:, 0:128].reshape(n_blocks, 2, 1, 2, 32)  # (n, half, nibble, k&1, l)
        qh = blocks[:, 128:192].reshape(n_blocks, 2, 1, 32)
        shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
        high = ((qh >> shifts) & np.uint8(3)) << np.uint8(4)  # (n, half, k, 32)
        low = (ql >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1, 1)) & np.uint8(0x0F)
        q = (low.reshape(n_blocks, 2, 4, 32) | high).view(np.int8) - np.int8(32)
        o = out.reshape(n_blocks, 2, 4, 2, 16)
        np.multiply(q.reshape(n_blocks, 2, 4, 2, 16), d_sub, out=o)
        return out

    @classmethod
    def native_quantize(cls, flat: np.ndarray) -> np.ndarray | None:
        return kquant_c.quantize_q6_k(flat)

    @classmethod
    def jit_dequantize(cls, flat: np.ndarray) -> np.ndarray:
        out = np.empty((flat.shape[0], 256), dtype=np.float32)
        numba_codecs.dequant_q6_k(flat, F16_TO_F32, out)
        return out

    @classmethod
    def scale_fields(cls, blocks: np.ndarray) -> list[np.ndarray]:
        return [f16_bits_to_f32(blocks[:, 208:210])]
