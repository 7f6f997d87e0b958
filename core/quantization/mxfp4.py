"""MXFP4 (OCP microscaling FP4): 32 weights per block, one E8M0 scale, 4-bit E2M1 codes (17 bytes, 4.25 bpw).

    byte  0    1                          17
          +----+---------------------------+
          | e  |  qs[0] qs[1] ... qs[15]   |   x[i]      = d * KVALUES[qs[i] & 0xF]   (i < 16)
          | u8 |  two 4-bit codes a byte   |   x[i + 16] = d * KVALUES[qs[i] >> 4]
          +----+---------------------------+   d = 2^(e - 127) / 2  (ggml_e8m0_to_fp32_half)

KVALUES are E2M1's eight magnitudes doubled (0, 1, 2, 3, 4, 6, 8, 12), then their negatives: the
layout of ggml's block_mxfp4 and of gguf-py's MXFP4 codec, which `dequantize_blocks` and
`quantize_blocks` match bit for bit (the quantizer deviates only where gguf-py's exponent leaves
the u8 range: a block whose largest magnitude is below 2^-125 gets e = 0 here, not a wrapped byte).

Hugging Face's gpt-oss checkpoints hold the same numbers in another order: ``*_blocks`` u8
[..., n_blocks, 16] with element 2j in the low nibble of byte j and element 2j+1 in the high one,
and ``*_scales`` u8 [..., n_blocks] holding e. `blocks_from_hub` repacks them into ggml blocks
without changing a value, so a holder keeps the checkpoint's own 4.25 bits per weight;
`dequantize_hub` is transformers' own decoding (a lookup of the FP4 value, then ldexp by e - 127),
the reference the repacking is checked against.

Pure module: numpy only, never Django.
"""

from __future__ import annotations

import numpy as np

BLOCK_SIZE = 32
TYPE_SIZE = 1 + BLOCK_SIZE // 2
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
# transformers' FP4_VALUES (integrations/mxfp4.py): E2M1 itself, KVALUES / 2
FP4_VALUES = KVALUES.astype(np.float32) / np.float32(2)


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """u8 E8M0 exponents (...) -> f32 2^(e - 128) (...), exactly ggml_e8m0_to_fp32_half: e 0 and 1
    are the subnormals 2^-128 and 2^-127, e 255 is 2^127 (no NaN)."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def dequantize_blocks(blocks: np.ndarray) -> np.ndarray:
    """u8 [n_blocks, 17] ggml blocks -> f32 [n_blocks, 32]."""
    assert blocks.ndim == 2 and blocks.shape[1] == TYPE_SIZE and blocks.dtype == np.uint8, (blocks.shape, blocks.dtype)
    d = e8m0_to_fp32_half(blocks[:, :1])  # (n, 1)
    qs = blocks[:, 1:]
    codes = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)  # (n, 32): low nibbles first
    with np.errstate(over="ignore"):  # e 255 times code ±12 is past f32's range: ±inf, as in ggml
        return d * KVALUES[codes].astype(np.float32)


def quantize_blocks(x: np.ndarray) -> np.ndarray:
    """f32 [n_blocks, 32] -> u8 [n_blocks, 17]: gguf-py's rule, e = floor(log2(amax)) - 2 + 127 (so the
    largest magnitude lands in E2M1's top binade) and each value to its nearest code (ties: the
    lower code, as argmin takes the first)."""
    assert x.ndim == 2 and x.shape[1] == BLOCK_SIZE and x.dtype == np.float32, (x.shape, x.dtype)
    amax = np.abs(x).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0)
    e = np.clip(e, 0, 255).astype(np.uint8)  # the deviation above: gguf-py wraps a negative e
    d = e8m0_to_fp32_half(e)  # (n, 1)
    errors = np.abs(d[:, :, None] * KVALUES.astype(np.float32)[None, None, :] - x[:, :, None])  # (n, 32, 16)
    codes = errors.argmin(axis=2).astype(np.uint8)  # (n, 32)
    qs = codes[:, : BLOCK_SIZE // 2] | (codes[:, BLOCK_SIZE // 2:] << np.uint8(4))
    return np.concatenate([e, qs], axis=1)


def blocks_from_hub(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """A gpt-oss checkpoint's ``*_blocks`` u8 [..., n_blocks, 16] and ``*_scales`` u8 [..., n_blocks]
    -> ggml blocks u8 [..., n_blocks, 17] holding the same values."""
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(f"MXFP4 blocks and scales are u8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != BLOCK_SIZE // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not pair "
                         f"(blocks [..., n_blocks, {BLOCK_SIZE // 2}], scales [..., n_blocks])")
    codes = np.empty((*blocks.shape[:-1], BLOCK_SIZE), dtype=np.uint8)
    codes[..., 0::2] = blocks & np.uint8(0x0F)  # element 2j: the low nibble of byte j
    codes[..., 1::2] = blocks >> np.uint8(4)
    half = BLOCK_SIZE // 2
    qs = codes[..., :half] | (codes[..., half:] << np.uint8(4))  # ggml: element i low, i + 16 high
    return np.concatenate([scales[..., None], qs], axis=-1)


def quantize_hub(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 [..., n] (n a multiple of 32) -> (blocks u8 [..., n/32, 16], scales u8 [..., n/32]) in the hub
    layout, by the rule of the tool that wrote the gpt-oss checkpoints (OpenAI's triton_kernels
    ``downcast_to_mxfp``, DequantScaleRoundingMode.ROUND_UP): the block's scale is amax/6 (6: E2M1's
    largest value) rounded up to a power of two, so no value clips, and each value x/scale goes to its
    nearest E2M1 value, ties to the even code. A block of zeros gets scale 2^-127 (e 0)."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"MXFP4 rows must be a multiple of {BLOCK_SIZE} long, got {x.shape[-1]}")
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK_SIZE)  # (..., n_blocks, 32)
    amax = np.abs(blocks).max(axis=-1)
    scale_bits = ((amax / np.float32(6)).view(np.uint32).astype(np.uint64) + 0x007FFFFF) & 0x7F800000
    e = np.minimum(scale_bits >> 23, 254).astype(np.uint8)  # the biased exponent of the rounded-up scale
    scaled = blocks / np.ldexp(np.float32(1), e.astype(np.int32) - 127)[..., None]
    # nearest E2M1 magnitude; on a tie the even code (the one whose last bit is 0)
    distance = np.abs(np.abs(scaled)[..., None] - FP4_VALUES[:8])  # (..., n_blocks, 32, 8)
    best = distance.min(axis=-1, keepdims=True)
    ties = distance == best
    odd = (np.arange(8) % 2).astype(bool)
    magnitude = np.where(ties & ~odd, 0, np.where(ties, 1, 2)).argmin(axis=-1).astype(np.uint8)
    codes = magnitude | np.where(np.signbit(scaled) & (magnitude > 0), np.uint8(8), np.uint8(0))
    packed = codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))  # element 2j low nibble, 2j+1 high
    return packed.astype(np.uint8), e


def dequantize_hub(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' convert_moe_packed_tensors in numpy: u8 [..., n_blocks, 16] and [..., n_blocks]
    -> f32 [..., n_blocks · 32]: FP4_VALUES looked up per nibble (low nibble first), times
    2^(scale - 127)."""
    values = np.empty((*blocks.shape[:-1], BLOCK_SIZE), dtype=np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & np.uint8(0x0F)]
    values[..., 1::2] = FP4_VALUES[blocks >> np.uint8(4)]
    with np.errstate(over="ignore"):
        out = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return out.reshape(*blocks.shape[:-2], -1)


__all__ = ["BLOCK_SIZE", "FP4_VALUES", "KVALUES", "TYPE_SIZE", "blocks_from_hub", "dequantize_blocks",
           "dequantize_hub", "e8m0_to_fp32_half", "quantize_blocks", "quantize_hub"]
