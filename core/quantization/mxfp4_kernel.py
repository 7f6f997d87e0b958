"""MXFP4 as a registered block format: the `BlockKernel` over the codec in `mxfp4`.

    byte  0    1                          17
          +----+---------------------------+
          | e  |  qs[0] qs[1] ... qs[15]   |   x[i]      = d * KVALUES[qs[i] & 0xF]   (i < 16)
          | u8 |  two 4-bit codes a byte   |   x[i + 16] = d * KVALUES[qs[i] >> 4]
          +----+---------------------------+   d = 2^(e - 128)  (ggml_e8m0_to_fp32_half)

Encoding is gguf-py's rule and decoding ggml's, bit for bit (`core.quantization.mxfp4`). The
scale is a power of two, so unlike the f16-scaled formats a block has no "scale field" that can
itself be inf or NaN: what can go wrong is a large e times a large code. `scale_fields` therefore
reports the largest magnitude a block's e allows (d·12), so the payload reader's finiteness check
refuses the blocks that can decode to an inf.

Pure module: numpy only, never Django.
"""

from __future__ import annotations

import numpy as np

from . import mxfp4
from .blocks import BlockKernel
from .types import GGMLType

_KVALUES_F32 = mxfp4.KVALUES.astype(np.float32)
_KMAX = np.float32(np.abs(_KVALUES_F32).max())  # 12: the largest code magnitude


class MXFP4(BlockKernel, ggml_type=GGMLType.MXFP4):
    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        return mxfp4.quantize_blocks(blocks)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        assert blocks.ndim == 2 and blocks.shape[1] == cls.type_size and blocks.dtype == np.uint8, (
            blocks.shape, blocks.dtype)
        if out is None:
            out = np.empty((blocks.shape[0], cls.block_size), dtype=np.float32)
        half = cls.block_size // 2
        d = mxfp4.e8m0_to_fp32_half(blocks[:, :1])  # (n_blocks, 1)
        qs = blocks[:, 1:]  # (n_blocks, 16)
        # the same single f32 product per value as mxfp4.dequantize_blocks, so the same bits;
        # e 255 (and 253-254 with a large code) overflow to ±inf as in ggml
        with np.errstate(over="ignore"):
            np.multiply(d, _KVALUES_F32[qs & np.uint8(0x0F)], out=out[:, :half])
            np.multiply(d, _KVALUES_F32[qs >> np.uint8(4)], out=out[:, half:])
        return out

    @classmethod
    def scale_fields(cls, blocks: np.ndarray) -> list[np.ndarray]:
        """f32 (n_blocks,): d·12, the largest magnitude a block of exponent e can decode to. It
        is inf for e >= 253 (2^125·12 > f32's max), so the reader refuses every block that can
        decode to an inf, whatever its codes. Trained weights are nowhere near (gguf-py's rule
        writes e <= 252 for any finite input), and an e = 255 block whose codes happen to decode
        finite would still overflow the C kernels' d_w·d_a product."""
        with np.errstate(over="ignore"):
            return [mxfp4.e8m0_to_fp32_half(blocks[:, 0]) * _KMAX]


__all__ = ["MXFP4"]
