"""Q4_K: 256-weight super-blocks of 8 sub-blocks x 32, 6-bit scales and mins (144 bytes, 4.5 bpw).

    byte 0    2      4                    16                                 144
         +----+------+--------------------+----------------------------------+
         | d  | dmin | scales[12]         | qs[128]                          |
         |f16 | f16  | 6-bit sc/m packed  | 4-bit quants, two per byte       |
         +----+------+--------------------+----------------------------------+

    x[32*j + i] = d * sc[j] * q - dmin * m[j]          (j = sub-block 0..7, q in 0..15)

  scales[12], 6-bit sc[0..7] (A..H) and m[0..7] (a..h), high bits of 4..7 spread out:
     0: EEAAAAAA   4: eeaaaaaa    8: eeeeEEEE
     1: FFBBBBBB   5: ffbbbbbb    9: ffffFFFF
     2: GGCCCCCC   6: ggcccccc   10: ggggGGGG
     3: HHDDDDDD   7: hhdddddd   11: hhhhHHHH

  qs: byte 32*c + l = q[64*c + l] | q[64*c + 32 + l] << 4   (c = 0..3, l = 0..31)

Scale/min choice follows llama.cpp's quantize_row_q4_K_ref: per sub-block a weighted
least-squares search over 21 candidate scales (make_qkx2_quants, nmax 15, rmin -1,
rdelta 0.1, weights sqrt(mean x^2) + |x|), then the 8 scales and 8 mins are themselves
quantized to 6 bits against the super-block maxima, and the quants recomputed from the
stored (f16 x 6-bit) values.

Two encoders.  With the C extension (apps.quantization.kquant_c, the default when built) the
bytes are llama.cpp's quantize_row_q4_K_ref's, bit for bit: same f32 loop order, and the
reference's quirks (a winning candidate's min shifts the range of later candidates; a
sub-block whose stored scale is 0 keeps the search's quants).  The numpy encoder below is
the fallback: it evaluates the candidates in closed form from f64 sums over a fixed range,
so its bytes can differ from the reference's in some blocks (its error is about the same).
The decode path is GGUF's.
"""

from __future__ import annotations

import numpy as np

from . import kquant_c, numba_codecs
from .blocks import BlockKernel, nearest_int
from .f16 import F16_TO_F32, f16_bits_to_f32
from .types import GGMLType

_NSUB, _SUB = 8, 32  # sub-blocks per super-block, weights per sub-block


def make_qkx2_quants(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized make_qkx2_quants (squared error) over x, w: (..., n) f32.

    Returns (scale, the_min), each (...,) f32, with x ~= scale * L - the_min, L in 0..nmax,
    the_min >= 0.  Each candidate's weighted squared error is evaluated in closed form from
    the five sums (no second pass over the weights); those per-sub-block sums are f64.
    """
    xmin = np.minimum(x.min(axis=-1), np.float32(0))  # (...,)
    xmax = x.max(axis=-1)
    rng = xmax - xmin
    # llama.cpp tests max == min; we also treat ranges below 1e-30 as flat so that
    # nmax / range cannot overflow (such sub-blocks are zero after f16 rounding anyway).
    degenerate = rng < np.float32(1e-30)
    rng = np.where(degenerate, np.float32(1), rng)

    wx = w * x
    sum_w = w.sum(axis=-1, dtype=np.float64)
    sum_x = wx.sum(axis=-1, dtype=np.float64)
    sum_x2 = np.einsum("...i,...i->...", wx, x, dtype=np.float64)
    xm = x - xmin[..., None]

    def sums(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lv = xm * iscale[..., None]
        np.rint(lv, out=lv)  # nearest_int: half to even
        np.clip(lv, 0, nmax, out=lv)
        wl = w * lv
        sum_l = wl.sum(axis=-1, dtype=np.float64)
        sum_l2 = np.einsum("...i,...i->...", wl, lv, dtype=np.float64)
        sum_xl = np.einsum("...i,...i->...", wl, x, dtype=np.float64)
        return sum_l, sum_l2, sum_xl

    def error(scale, mn, sum_l, sum_l2, sum_xl):
        # sum w (scale*L + mn - x)^2, expanded
        return (scale * scale * sum_l2 + mn * mn * sum_w + sum_x2
                + 2 * scale * mn * sum_l - 2 * scale * sum_xl - 2 * mn * sum_x)

    iscale = np.float32(nmax) / rng
    scale = (np.float32(1) / iscale).astype(np.float64)
    mn = xmin.astype(np.float64)
    best = error(scale, mn, *sums(iscale))
    for step in range(nstep + 1):
        iscale = (np.float32(rmin) + np.float32(rdelta) * np.float32(step) + np.float32(nmax)) / rng
        sum_l, sum_l2, sum_xl = sums(iscale)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        det = np.where(ok, det, 1.0)
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = this_min > 0  # a positive offset is not representable: refit through 0
        this_min = np.where(positive, 0.0, this_min)
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = np.where(positive, sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0), this_scale)
        err = error(this_scale, this_min, sum_l, sum_l2, sum_xl)
        better = ok & (err < best)
        best = np.where(better, err, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    scale = np.where(degenerate, 0.0, scale).astype(np.float32)
    return scale, (-mn).astype(np.float32)


def pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit sc, m (n, 8) u8 -> the 12-byte get_scale_min_k4 layout (n, 12) u8."""
    lo_s, hi_s = ls[:, :4], ls[:, 4:]
    lo_m, hi_m = lm[:, :4], lm[:, 4:]
    return np.concatenate([
        lo_s | ((hi_s >> 4) << 6),
        lo_m | ((hi_m >> 4) << 6),
        (hi_s & 0x0F) | ((hi_m & 0x0F) << 4),
    ], axis=1)


def unpack_scales_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) u8 -> 6-bit sc, m, each (n, 8) u8 (inverse of pack_scales_k4)."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)], axis=1)
    m = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc, m


class Q4_K(BlockKernel, ggml_type=GGMLType.Q4_K):
    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == 256 and blocks.dtype == np.float32
        n_blocks = blocks.shape[0]
        x = blocks.reshape(n_blocks, _NSUB, _SUB)  # (n_blocks, 8, 32)
        av_x = np.sqrt(np.einsum("bji,bji->bj", x, x) / np.float32(_SUB))  # (n_blocks, 8)
        w = np.abs(x)
        w += av_x[..., None]
        scales, mins = make_qkx2_quants(x, w, 15, -1.0, 0.1, 20)  # (n_blocks, 8) each
        return cls.encode(x, scales, mins)

    @classmethod
    def encode(cls, x: np.ndarray, scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
        """Pack x (n_blocks, 8, 32) given per-sub-block scales and mins (n_blocks, 8), f32 >= 0."""
        n_blocks = x.shape[0]
        max_scale = scales.max(axis=1, keepdims=True)  # (n_blocks, 1)
        max_min = mins.max(axis=1, keepdims=True)
        with np.errstate(divide="ignore", over="ignore"):
            inv_scale = np.where(max_scale > 0, np.float32(63) / max_scale, np.float32(0))
            inv_min = np.where(max_min > 0, np.float32(63) / max_min, np.float32(0))
            # 63 / (a subnormal maximum) overflows; those sub-blocks round to 0 in f16 anyway.
            inv_scale[np.isinf(inv_scale)] = 0
            inv_min[np.isinf(inv_min)] = 0
            d16 = (max_scale / np.float32(63)).astype("<f2")  # inf here is reported by the registry
            dmin16 = (max_min / np.float32(63)).astype("<f2")
        ls = np.minimum(nearest_int(inv_scale * scales), 63).astype(np.uint8)
        lm = np.minimum(nearest_int(inv_min * mins), 63).astype(np.uint8)

        # Quants from the values the decoder will actually see.
        d_sub = (d16.astype(np.float32) * ls)[..., None]  # (n_blocks, 8, 1)
        m_sub = (dmin16.astype(np.float32) * lm)[..., None]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = (x + m_sub) / d_sub
        q = np.where(d_sub != 0, q, 0)
        np.rint(q, out=q)
        np.clip(q, 0, 15, out=q)
        q = q.astype(np.uint8).reshape(n_blocks, 4, 2, _SUB)  # (n_blocks, chunk, half, 32)

        out = np.empty((n_blocks, cls.type_size), dtype=np.uint8)
        out[:, 0:2] = d16.view(np.uint8)
        out[:, 2:4] = dmin16.view(np.uint8)
        out[:, 4:16] = pack_scales_k4(ls, lm)
        out[:, 16:].reshape(n_blocks, 4, _SUB)[:] = q[:, :, 0] | (q[:, :, 1] << 4)
        return out

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == cls.type_size and blocks.dtype == np.uint8
        n_blocks = blocks.shape[0]
        if out is None:
            out = np.empty((n_blocks, 256), dtype=np.float32)
        d = f16_bits_to_f32(blocks[:, 0:2])  # (n_blocks, 1)
        dmin = f16_bits_to_f32(blocks[:, 2:4])
        sc, m = unpack_scales_k4(blocks[:, 4:16])  # (n_blocks, 8)
        d_sub = (d * sc).reshape(n_blocks, 4, 2, 1)  # f32, same product as GGUF's decoder
        m_sub = (dmin * m).reshape(n_blocks, 4, 2, 1)
        qs = blocks[:, 16:].reshape(n_blocks, 4, 1, _SUB)  # (n_blocks, chunk, 1, 32)
        o = out.reshape(n_blocks, 4, 2, _SUB)
        np.multiply(qs[:, :, :, :] & np.uint8(0x0F), d_sub[:, :, 0:1], out=o[:, :, 0:1])
        np.multiply(qs >> np.uint8(4), d_sub[:, :, 1:2], out=o[:, :, 1:2])
        np.subtract(o, m_sub, out=o)
        return out

    @classmethod
    def native_quantize(cls, flat: np.ndarray) -> np.ndarray | None:
        return kquant_c.quantize_q4_k(flat)

    @classmethod
    def jit_dequantize(cls, flat: np.ndarray) -> np.ndarray:
        out = np.empty((flat.shape[0], 256), dtype=np.float32)
        numba_codecs.dequant_q4_k(flat, F16_TO_F32, out)
        return out

    @classmethod
    def scale_fields(cls, blocks: np.ndarray) -> list[np.ndarray]:
        return [f16_bits_to_f32(blocks[:, 0:2]), f16_bits_to_f32(blocks[:, 2:4])]
