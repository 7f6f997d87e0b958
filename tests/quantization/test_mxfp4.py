"""MXFP4 against gguf-py's codec, bit for bit, and gpt-oss's hub layout against transformers' decoding."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from core.quantization import mxfp4


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def test_dequantize_equals_gguf_for_every_scale_and_code() -> None:
    rng = np.random.default_rng(0)
    n = 256 * 8  # every E8M0 byte (0 and 1 the subnormal scales, 255 the top one), 8 random blocks each
    blocks = rng.integers(0, 256, size=(n, mxfp4.TYPE_SIZE), dtype=np.uint8)
    blocks[:, 0] = np.repeat(np.arange(256, dtype=np.uint8), 8)
    blocks[:16, 1:] = np.arange(16, dtype=np.uint8) * 17  # every code in both nibbles
    ours = mxfp4.dequantize_blocks(blocks)
    with np.errstate(over="ignore"):  # e 255 with code 12: past f32's range, inf in both
        theirs = gguf_quants.dequantize(blocks.reshape(-1), GGMLQuantizationType.MXFP4).reshape(n, 32)
    np.testing.assert_array_equal(_bits(ours), _bits(theirs))
    assert mxfp4.e8m0_to_fp32_half(np.array([0, 1, 127, 254]))[:3].tolist() == [2.0 ** -128, 2.0 ** -127, 0.5]


@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1.0, 7.0, 3e5, 1e30])
def test_quantize_equals_gguf(scale: float) -> None:
    rng = np.random.default_rng(int(np.log10(scale) + 40))
    x = (rng.standard_normal((64, 32)) * scale).astype(np.float32)
    x[0] = 0  # an all-zero block: e 0, every code 0
    x[1, :4] = [scale, -scale, scale / 2, -scale / 3]  # exact ties between codes and the largest magnitude
    ours = mxfp4.quantize_blocks(x)
    theirs = gguf_quants.quantize(x.reshape(-1), GGMLQuantizationType.MXFP4).reshape(64, mxfp4.TYPE_SIZE)
    np.testing.assert_array_equal(ours, theirs)
    back = mxfp4.dequantize_blocks(ours)
    # E2M1 keeps one mantissa bit: within half a step of the block's top binade
    amax = np.abs(x).max(axis=1, keepdims=True)
    assert (np.abs(back - x) <= amax / 4 + 1e-45).all()


def test_a_block_below_2_to_the_minus_125_gets_the_smallest_scale() -> None:
    x = np.full((1, 32), 1e-39, dtype=np.float32)  # gguf-py's e would be negative and wrap
    assert mxfp4.quantize_blocks(x)[0, 0] == 0


def test_hub_blocks_repack_to_ggml_without_changing_a_value() -> None:
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, size=(2, 5, 3, 16), dtype=np.uint8)  # [experts, rows, n_blocks, 16]
    scales = rng.integers(110, 140, size=(2, 5, 3), dtype=np.uint8)
    ggml = mxfp4.blocks_from_hub(blocks, scales)
    assert ggml.shape == (2, 5, 3, 17)
    hub = mxfp4.dequantize_hub(blocks, scales)  # [2, 5, 96]
    ours = mxfp4.dequantize_blocks(ggml.reshape(-1, 17)).reshape(2, 5, 96)
    np.testing.assert_array_equal(_bits(ours), _bits(hub))
    # the first block's first two elements: the low then the high nibble of its first byte
    b, e = int(blocks[0, 0, 0, 0]), int(scales[0, 0, 0])
    assert hub[0, 0, :2].tolist() == [mxfp4.FP4_VALUES[b & 15] * 2.0 ** (e - 127),
                                      mxfp4.FP4_VALUES[b >> 4] * 2.0 ** (e - 127)]


def test_hub_tensors_that_do_not_pair_are_refused() -> None:
    with pytest.raises(ValueError, match="do not pair"):
        mxfp4.blocks_from_hub(np.zeros((4, 2, 16), np.uint8), np.zeros((4, 3), np.uint8))
    with pytest.raises(ValueError, match="are u8"):
        mxfp4.blocks_from_hub(np.zeros((4, 2, 16), np.int8), np.zeros((4, 2), np.uint8))
