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

Two encoders, the same bytes.  The C extension (core.quantization.kquant_c, the default
when built) and the numpy encoder below both do llama.cpp's quantize_row_q4_K_ref in f32,
operation for operation in the C order: every sum accumulates index by index from 0
(sum_in_order), nearest_int is the 1.5*2^23 bit trick (nearest_int), and the reference's
quirks decide the bytes: a winning candidate's min shifts the range and the offset of the
later candidates, a sub-block whose stored scale is 0 keeps the search's quants, a flat
sub-block (max == min) gets scale 0 and quants 0.  The tests compare both encoders with
llama.cpp's golden hashes and with each other byte for byte, so a blob's hash does not
depend on whether the extension was built.  The decode path is GGUF's.

The numpy search works on x transposed to (32, n_sub): row i holds value i of every
sub-block, so each per-index step is one vectorized operation over all sub-blocks, and the
only Python loops are over the 32 indices and the 21 candidate scales.
"""

from __future__ import annotations

import numpy as np

from . import kquant_c, numba_codecs
from .blocks import BlockKernel, nearest_int, sum_in_order
from .f16 import F16_TO_F32, f16_bits_to_f32
from .types import GGMLType

_NSUB, _SUB = 8, 32  # sub-blocks per super-block, weights per sub-block


def make_qkx2_quants(
    xt: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's make_qkx2_quants (squared error) for every sub-block at once, in C's f32 order.

    xt, w: f32 (n, n_sub), value i of sub-block s at [i, s].  Returns scale (n_sub,) f32,
    the_min (n_sub,) f32 >= 0 and L (n, n_sub) int32 in 0..nmax, with x ~= scale*L - the_min.
    """
    n, n_sub = xt.shape
    f32 = np.float32
    mn, mx = xt[0].copy(), xt[0].copy()
    for i in range(1, n):  # strict comparisons: the first extreme wins, as in C
        np.copyto(mn, xt[i], where=xt[i] < mn)
        np.copyto(mx, xt[i], where=xt[i] > mx)
    with np.errstate(over="ignore", invalid="ignore"):  # |x| near f32 max: inf/NaN, as in C
        sum_w = sum_in_order(w, first=True)
        sum_x = sum_in_order(w * xt, first=True)
    mn[mn > 0] = 0
    flat = mx == mn  # the reference returns scale 0, L 0, the_min -min here
    # scratch reused by every candidate (in-place passes: this loop is the encoder's cost)
    v, lf = np.empty((n, n_sub), f32), np.empty((n, n_sub), f32)
    la = np.empty((n, n_sub), np.int32)
    terms = np.empty((n, 3, n_sub), f32)  # per index: w*l, w*l*l, w*l*x (the sums of one candidate)

    def quants(iscale: np.ndarray, out: np.ndarray) -> None:
        """out = clamp(nearest_int(iscale * (x - min)), 0, nmax), int32 (n, n_sub); lf = out as f32."""
        np.multiply(np.subtract(xt, mn, out=v), iscale, out=v)
        nearest_int(v, out=out)
        np.clip(out, 0, nmax, out=out)
        np.copyto(lf, out)

    def error(scale: np.ndarray, the_min: np.ndarray) -> np.ndarray:
        """sum_i w * (scale*L + min - x)^2 over lf, in index order."""
        np.subtract(np.add(np.multiply(lf, scale, out=v), the_min, out=v), xt, out=v)
        return sum_in_order(np.multiply(w, np.multiply(v, v, out=v), out=v))

    with np.errstate(all="ignore"):  # flat sub-blocks divide by 0; they are masked at the end
        iscale = f32(nmax) / (mx - mn)
        scale = f32(1) / iscale
        L = np.empty((n, n_sub), np.int32)
        quants(iscale, L)
        best = error(scale, mn)
        for step in range(nstep + 1):
            # (rmin + rdelta*is + nmax) / (max - min), with min as moved by earlier winners
            iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / (mx - mn)
            quants(iscale, la)
            wl = np.multiply(w, lf, out=terms[:, 0])
            np.multiply(wl, lf, out=terms[:, 1])
            np.multiply(wl, xt, out=terms[:, 2])
            sum_l, sum_l2, sum_xl = sum_in_order(terms)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0  # a positive offset is not representable: refit through 0
            this_min[positive] = 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
            cur = error(this_scale, this_min)
            better = (det > 0) & ~flat & (cur < best)
            np.copyto(L, la, where=better)
            np.copyto(best, cur, where=better)
            np.copyto(scale, this_scale, where=better)
            np.copyto(mn, this_min, where=better)
    L[:, flat] = 0
    scale[flat] = 0
    return scale, -mn, L


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
    # 1024 blocks per numpy call: the search's per-index Python loop runs ~1000 numpy calls per
    # chunk; measured ~40% faster than 256 blocks at Q4_K, slower again at 4096 (out of L2)
    quantize_chunk = 1 << 18

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == 256 and blocks.dtype == np.float32
        n_blocks = blocks.shape[0]
        xt = np.ascontiguousarray(blocks.reshape(n_blocks * _NSUB, _SUB).T)  # (32, n_sub)
        with np.errstate(over="ignore"):  # x^2 overflows for |x| > 1.8e19; the scales then do too
            av_x = np.sqrt(sum_in_order(xt * xt) / np.float32(_SUB))  # (n_sub,)
        w = av_x + np.abs(xt)
        scales, mins, L = make_qkx2_quants(xt, w, 15, -1.0, 0.1, 20)
        return cls.encode(blocks.reshape(n_blocks, _NSUB, _SUB), scales.reshape(n_blocks, _NSUB),
                          mins.reshape(n_blocks, _NSUB), L.T.reshape(n_blocks, _NSUB, _SUB))

    @classmethod
    def encode(cls, x: np.ndarray, scales: np.ndarray, mins: np.ndarray, L: np.ndarray | None = None) -> np.ndarray:
        """Pack x (n_blocks, 8, 32) given per-sub-block scales and mins (n_blocks, 8) f32 >= 0.

        L (n_blocks, 8, 32) int, the search's quants, is kept where a stored 6-bit scale is 0
        (as the reference does); None means zeros.
        """
        n_blocks = x.shape[0]
        f32 = np.float32
        max_scale = np.zeros(n_blocks, f32)  # the reference's running maxima, from 0
        max_min = np.zeros(n_blocks, f32)
        for j in range(_NSUB):
            np.copyto(max_scale, scales[:, j], where=scales[:, j] > max_scale)
            np.copyto(max_min, mins[:, j], where=mins[:, j] > max_min)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            # 63 / a subnormal maximum is inf, as in C; nearest_int then yields 0
            inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0))[:, None]
            inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0))[:, None]
            ls = np.minimum(nearest_int(inv_scale * scales).astype(np.uint8), 63)  # int -> u8 wraps, as in C
            lm = np.minimum(nearest_int(inv_min * mins).astype(np.uint8), 63)
            d16 = (max_scale / f32(63)).astype("<f2")  # inf here is reported by the registry
            dmin16 = (max_min / f32(63)).astype("<f2")
            # quants from the values the decoder will see; a zero scale keeps L
            d_sub = (d16.astype(f32)[:, None] * ls.astype(f32))[..., None]  # (n_blocks, 8, 1)
            m_sub = (dmin16.astype(f32)[:, None] * lm.astype(f32))[..., None]
            q = np.clip(nearest_int((x + m_sub) / d_sub), 0, 15)
        if L is None:
            L = np.zeros(q.shape, np.int32)
        q = np.where(d_sub != 0, q, L).astype(np.uint8).reshape(n_blocks, 4, 2, _SUB)  # (n_blocks, chunk, half, 32)

        out = np.empty((n_blocks, cls.type_size), dtype=np.uint8)
        out[:, 0:2] = d16.view(np.uint8).reshape(n_blocks, 2)
        out[:, 2:4] = dmin16.view(np.uint8).reshape(n_blocks, 2)
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
