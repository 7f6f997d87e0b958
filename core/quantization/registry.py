"""Public quantize/dequantize over every GGMLType, dense or block.

    quantize(x f32 [rows, n], type)          -> u8 [rows, row_bytes(type, n)]
    dequantize(u8 [rows, row_bytes], type, (rows, n)) -> f32 [rows, n]

Dense types are their raw little-endian bytes viewed as u8 (F32, F16 round-to-nearest-even,
BF16 round-to-nearest-even with NaN kept quiet, as ggml_compute_fp32_to_bf16).

Pure module: numpy only, never Django.
"""

from __future__ import annotations

import numpy as np

from . import kquant_c, mxfp4_kernel, numba_codecs, q4_k, q6_k, q8_0  # noqa: F401  (importing registers the kernels)
from .blocks import KERNELS, BlockKernel
from .types import GGMLType, parse_type, row_bytes

__all__ = ["KERNELS", "dense_to_f32", "dequantize", "encoder", "f32_to_dense", "kernel", "quantize"]


def kernel(ggml_type: GGMLType) -> type[BlockKernel]:
    """The registered block kernel for a block type."""
    ggml_type = parse_type(ggml_type)
    try:
        return KERNELS[ggml_type]
    except KeyError:
        raise ValueError(f"{ggml_type.value} is not a block type") from None


def encoder(ggml_type: GGMLType) -> str:
    """Which encoder `quantize` runs for a type now: "c" (core.quantization._kquant_encoders, llama.cpp's
    reference quantizer), "numba", "numpy" (block types) or "dense"."""
    ggml_type = parse_type(ggml_type)
    if not ggml_type.is_block:
        return "dense"
    k = KERNELS[ggml_type]
    if kquant_c.enabled() and k.native_quantize.__func__ is not BlockKernel.native_quantize.__func__:
        return "c"
    if numba_codecs.enabled() and k.jit_quantize.__func__ is not BlockKernel.jit_quantize.__func__:
        return "numba"
    return "numpy"


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns (u16), round to nearest even, NaN forced quiet."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (bits.astype(np.uint64) + (np.uint64(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> 16
    out = rounded.astype(np.uint16)
    if is_nan.any():
        out[is_nan] = ((bits[is_nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_dense(x: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """f32 -> the dense array stored for F32 (f4), F16 (f2) or BF16 (u16 bit patterns)."""
    if ggml_type == GGMLType.F32:
        return np.ascontiguousarray(x, dtype="<f4")
    if ggml_type == GGMLType.F16:
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(x, dtype=np.float32).astype("<f2")
    if ggml_type == GGMLType.BF16:
        return f32_to_bf16_bits(x).astype("<u2", copy=False)
    raise ValueError(f"{ggml_type.value} is not a dense type")


def dense_to_f32(dense: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    if ggml_type == GGMLType.F32:
        return dense.astype(np.float32, copy=False)
    if ggml_type == GGMLType.F16:
        return dense.astype(np.float32)
    if ggml_type == GGMLType.BF16:
        return bf16_bits_to_f32(dense)
    raise ValueError(f"{ggml_type.value} is not a dense type")


_DENSE_DTYPE = {GGMLType.F32: "<f4", GGMLType.F16: "<f2", GGMLType.BF16: "<u2"}


def quantize(x: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """f32 [rows, n] -> u8 [rows, row_bytes(ggml_type, n)].

    Preconditions: x is 2-D, finite, and n is a multiple of the type's block size (use
    `resolve_type` first).  Raises ValueError otherwise, and when a value is too large for
    the format's f16 scales (the stored scale would be infinite).
    """
    ggml_type = parse_type(ggml_type)
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"quantize expects a 2-D [rows, n] array, got shape {x.shape}")
    if x.dtype != np.float32:
        x = x.astype(np.float32)
    rows, n = x.shape
    nbytes = row_bytes(ggml_type, n)  # validates divisibility
    if not np.isfinite(x).all():
        raise ValueError(f"cannot quantize to {ggml_type.value}: input has non-finite values")
    if not ggml_type.is_block:
        dense = f32_to_dense(x, ggml_type)
        if ggml_type != GGMLType.F32 and not np.isfinite(dense_to_f32(dense, ggml_type)).all():
            raise ValueError(f"values overflow {ggml_type.value} (max |x| = {np.abs(x).max()})")
        return dense.view(np.uint8).reshape(rows, nbytes)
    k = KERNELS[ggml_type]
    out = k.quantize_rows(x)
    flat = out.reshape(-1, k.type_size)
    if not all(np.isfinite(s).all() for s in k.scale_fields(flat)):
        raise ValueError(f"values overflow the f16 scales of {ggml_type.value} (max |x| = {np.abs(x).max()})")
    return out


def dequantize(data: np.ndarray, ggml_type: GGMLType, shape: tuple[int, int]) -> np.ndarray:
    """u8 [rows, row_bytes] (or any buffer of that many bytes) -> f32 [rows, n]."""
    ggml_type = parse_type(ggml_type)
    rows, n = (int(v) for v in shape)
    nbytes = row_bytes(ggml_type, n)
    raw = np.asarray(data)
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).view(np.uint8)
    if raw.size != rows * nbytes:
        raise ValueError(
            f"{ggml_type.value} [{rows}, {n}] needs {rows * nbytes} bytes, got {raw.size}")
    raw = raw.reshape(rows, nbytes)
    if not ggml_type.is_block:
        dense = np.ascontiguousarray(raw).view(_DENSE_DTYPE[ggml_type])
        return dense_to_f32(dense, ggml_type).reshape(rows, n)
    return KERNELS[ggml_type].dequantize_rows(raw, n)
