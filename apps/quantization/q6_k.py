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

Two encoders.  With the C extension (apps.quantization.kquant_c, the default when built) the
bytes are llama.cpp's quantize_row_q6_K_ref's, bit for bit (f32 sums in the C loop order;
an all-zero sub-block keeps quants 0 and a sub-block whose stored scale is 0 keeps the
search's quants, as in the reference).  The numpy encoder below is the fallback (f64 sums,
quants 32 for zero-scale sub-blocks): same decoded values up to rare scale ties.
"""

from __future__ import annotations

import numpy as np

from . import kquant_c, numba_codecs
from .blocks import BlockKernel, nearest_int
from .f16 import F16_TO_F32, f16_bits_to_f32
from .types import GGMLType

_NSUB, _SUB = 16, 16
GROUP_MAX_EPS = np.float32(1e-15)  # llama.cpp: a super-block with smaller scales is all zero


def make_qx_quants(x: np.ndarray, nmax: int) -> np.ndarray:
    """Vectorized make_qx_quants with rmse_type 1 (weights x^2), x: (..., n) f32.

    Returns the signed scale (...,) f32 such that x ~= scale * l with l in -nmax..nmax-1
    (scale < 0 when the largest-magnitude element is positive, as in llama.cpp).
    """
    idx = np.abs(x).argmax(axis=-1)[..., None]  # first maximum, like the C loop's strict '>'
    vmax = np.take_along_axis(x, idx, axis=-1)[..., 0]  # (...,)
    zero = np.abs(vmax) < np.float32(1e-30)
    vmax = np.where(zero, np.float32(1), vmax)
    w = x * x
    wx = w * x

    def sums(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lv = x * iscale[..., None]
        np.rint(lv, out=lv)  # nearest_int
        np.clip(lv, -nmax, nmax - 1, out=lv)
        sumlx = np.einsum("...i,...i->...", wx, lv, dtype=np.float64)
        suml2 = np.einsum("...i,...i->...", w * lv, lv, dtype=np.float64)
        return sumlx, suml2

    sumlx, suml2 = sums(np.float32(-nmax) / vmax)
    has = suml2 > 0  # false only when every weight x^2 underflowed
    scale = np.where(has, sumlx / np.where(has, suml2, 1.0), 0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(np.float32(nmax) + np.float32(0.1) * np.float32(step)) / vmax
        sumlx, suml2 = sums(iscale)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        this_scale = sumlx / np.where(suml2 > 0, suml2, 1.0)
        scale = np.where(better, this_scale, scale)
        best = np.where(better, this_scale * sumlx, best)
    return np.where(zero, 0.0, scale).astype(np.float32)


class Q6_K(BlockKernel, ggml_type=GGMLType.Q6_K):
    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == 256 and blocks.dtype == np.float32
        n_blocks = blocks.shape[0]
        x = blocks.reshape(n_blocks, _NSUB, _SUB)  # (n_blocks, 16, 16)
        scales = make_qx_quants(x, 32)  # (n_blocks, 16), signed
        return cls.encode(x, scales)

    @classmethod
    def encode(cls, x: np.ndarray, scales: np.ndarray) -> np.ndarray:
        """Pack x (n_blocks, 16, 16) given signed per-sub-block scales (n_blocks, 16) f32."""
        n_blocks = x.shape[0]
        idx = np.abs(scales).argmax(axis=1)[:, None]
        max_scale = np.take_along_axis(scales, idx, axis=1)  # (n_blocks, 1), signed
        empty = np.abs(max_scale) < GROUP_MAX_EPS
        with np.errstate(divide="ignore", over="ignore"):
            iscale = np.where(empty, np.float32(0), np.float32(-128) / max_scale)
            d16 = np.where(empty, np.float32(0), np.float32(1) / iscale).astype("<f2")  # inf: registry reports
        sc = np.minimum(nearest_int(iscale * scales), 127).astype(np.int8)  # (n_blocks, 16)

        d_sub = (d16.astype(np.float32) * sc)[..., None]  # (n_blocks, 16, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = x / d_sub
        q = np.where(d_sub != 0, q, 0)
        np.rint(q, out=q)
        np.clip(q, -32, 31, out=q)
        q += 32
        q = q.astype(np.uint8)
        q[empty[:, 0]] = 0  # llama.cpp zeroes the whole block
        q = q.reshape(n_blocks, 2, 4, 32)  # (n_blocks, half, k, l)

        out = np.empty((n_blocks, cls.type_size), dtype=np.uint8)
        lo = q & np.uint8(0x0F)
        out[:, 0:128].reshape(n_blocks, 2, 2, 32)[:] = lo[:, :, 0:2] | (lo[:, :, 2:4] << 4)
        hi = q >> 4
        out[:, 128:192].reshape(n_blocks, 2, 32)[:] = (
            hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
        )
        out[:, 192:208] = sc.view(np.uint8)
        out[:, 208:210] = d16.view(np.uint8)
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
