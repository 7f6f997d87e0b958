"""Q8_0: 32 weights per block, one f16 scale, int8 quants (34 bytes, 8.5 bpw).

    byte  0      2                                   34
          +------+-----------------------------------+
          |  d   |  qs[0] qs[1] ...          qs[31]  |   x[i] = d * qs[i]
          | f16  |  int8 x 32                        |
          +------+-----------------------------------+

Quantization is bit-identical to llama.cpp's quantize_row_q8_0_ref: d = amax/127 in f32,
qs = roundf(x * (1/d)) (round half away from zero) using the f32 d, then d stored as f16.
"""

from __future__ import annotations

import numpy as np

from . import numba_codecs
from .blocks import BlockKernel
from .f16 import F16_TO_F32, f16_bits_to_f32
from .types import GGMLType


def round_half_away(v: np.ndarray) -> np.ndarray:
    """C roundf, in place on an f32 array: trunc(v) + trunc(2 * frac(v)); exact for all f32."""
    t = np.trunc(v)
    np.subtract(v, t, out=v)  # frac, exact
    np.multiply(v, np.float32(2), out=v)  # |2*frac| < 2, exact
    np.trunc(v, out=v)  # -1, 0 or 1
    np.add(v, t, out=v)
    return v


class Q8_0(BlockKernel, ggml_type=GGMLType.Q8_0):
    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == 32 and blocks.dtype == np.float32
        n_blocks = blocks.shape[0]
        out = np.empty((n_blocks, cls.type_size), dtype=np.uint8)
        # (n_blocks, 1)
        d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
        with np.errstate(divide="ignore", over="ignore"):
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
            # Deviation from llama.cpp, only for blocks with amax < ~1e-36: 1/d overflows to
            # inf and C casts inf/NaN to int8 (undefined).  Such a d is 0 in f16, so the
            # block decodes to zeros either way; we store zero quants instead of garbage.
            inv[np.isinf(inv)] = 0
            q = round_half_away(blocks * inv)  # (n_blocks, 32), integers in [-127, 127]
            out[:, :2] = d.astype("<f2").view(np.uint8)
        np.copyto(out[:, 2:].view(np.int8), q, casting="unsafe")
        return out

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == cls.type_size and blocks.dtype == np.uint8
        if out is None:
            out = np.empty((blocks.shape[0], 32), dtype=np.float32)
        d = f16_bits_to_f32(blocks[:, :2])  # (n_blocks, 1)
        # One ufunc pass: int8 is widened to f32 inside the loop, then multiplied by d.
        np.multiply(blocks[:, 2:].view(np.int8), d, out=out)
        return out

    @classmethod
    def jit_quantize(cls, flat: np.ndarray) -> np.ndarray:
        n_blocks = flat.shape[0]
        d = np.empty(n_blocks, dtype=np.float32)
        out = np.empty((n_blocks, cls.type_size), dtype=np.uint8)
        qs = np.empty((n_blocks, 32), dtype=np.int8)
        numba_codecs.quant_q8_0(flat, d, qs)
        with np.errstate(over="ignore"):  # overflow is reported by registry.quantize
            out[:, :2] = d.astype("<f2").view(np.uint8).reshape(n_blocks, 2)
        out[:, 2:] = qs.view(np.uint8)
        return out

    @classmethod
    def jit_dequantize(cls, flat: np.ndarray) -> np.ndarray:
        out = np.empty((flat.shape[0], 32), dtype=np.float32)
        numba_codecs.dequant_q8_0(flat, F16_TO_F32, out)
        return out

    @classmethod
    def scale_fields(cls, blocks: np.ndarray) -> list[np.ndarray]:
        return [f16_bits_to_f32(blocks[:, :2])]
