"""The f16 -> f32 lookup table every compiled kernel indexes (core/quantization/f16.py)."""

from __future__ import annotations

import numpy as np

from core.quantization.f16 import F16_TO_F32, f16_bits_to_f32


def test_table_is_exact_for_every_bit_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ref = bits.view(np.float16).astype(np.float32)
    finite = np.isfinite(ref)
    assert F16_TO_F32.dtype == np.float32 and F16_TO_F32.shape == (1 << 16,)
    assert np.array_equal(F16_TO_F32[finite].view(np.uint32), ref[finite].view(np.uint32))  # signed zeros too
    assert np.isinf(F16_TO_F32[[0x7C00, 0xFC00]]).all() and np.isnan(F16_TO_F32[0x7E00])
    assert not F16_TO_F32.flags.writeable
    raw = bits.view(np.uint8).reshape(-1, 2)
    assert np.array_equal(f16_bits_to_f32(raw)[:, 0].view(np.uint32), ref.view(np.uint32))
