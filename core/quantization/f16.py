"""IEEE half floats as GGML stores them: little-endian u16 scale fields inside the blocks.

    F16_TO_F32[bits]          f32[65536]: every f16 bit pattern widened to f32 (exact)
    f16_bits_to_f32(raw)      (…, 2) u8 -> (…, 1) f32

The table is for compiled kernels (numba has no f16 type, and one 256 KiB lookup per block
is cheaper than a conversion): core.quantization.numba_codecs and core.experts.numba_matmul
both index it.  inf and NaN map through as inf and NaN.

Pure module: numpy only, never Django.
"""

from __future__ import annotations

import numpy as np

F16_TO_F32: np.ndarray = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
F16_TO_F32.flags.writeable = False  # shared by every kernel call: nobody may patch it


def f16_bits_to_f32(raw: np.ndarray) -> np.ndarray:
    """(…, 2) u8 little-endian half floats -> (…, 1) f32 (exact widening)."""
    return raw.view("<f2").astype(np.float32)

