"""Shared machinery for the per-format block kernels.

Each format is one subclass of `BlockKernel`, registered by its `GGMLType`, with
`quantize_blocks` (f32 (n_blocks, block_size) -> u8 (n_blocks, type_size)) and
`dequantize_blocks` (the inverse direction).  Faster encoders hook in per format:
`native_quantize` (the C extension, tried first) and `jit_quantize` (numba); each returns
None when unavailable or switched off, and quantize_blocks is the numpy fallback.
`quantize_rows`/`dequantize_rows` assert dtype and shape at the boundary and process the
rows in cache-sized chunks of whole blocks: every kernel is fully vectorized over the
blocks of a chunk (no Python loop over blocks), and chunking only keeps the many-pass numpy
temporaries inside L2.

Pure module: numpy only, never Django.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from . import numba_codecs
from .types import BLOCK_GEOMETRY, GGMLType

KERNELS: dict[GGMLType, type[BlockKernel]] = {}

# Elements per chunk handed to a kernel; 64 Ki f32 = 256 KiB, a few temporaries fit in L2.
CHUNK_ELEMENTS = 1 << 16


_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23


def nearest_int(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's nearest_int, bit for bit: f32 (...) -> int32 (...).

    Adding 1.5*2^23 leaves the rounded integer (half to even) in the low mantissa bits for
    |x| <= 2^22.  Beyond that, and for inf or NaN, the result is the same deterministic
    garbage as in C (the encoders clamp it), which np.rint would not reproduce.  With `out`
    (int32, x's shape) x is overwritten as scratch and the result written to out.
    """
    assert x.dtype == np.float32, x.dtype
    if out is None:
        bits = (x + _MAGIC).view(np.int32)
        return (bits & np.int32(0x007FFFFF)) - np.int32(0x00400000)
    x += _MAGIC
    np.bitwise_and(x.view(np.int32), np.int32(0x007FFFFF), out=out)
    out -= np.int32(0x00400000)
    return out


def sum_in_order(terms: np.ndarray, *, first: bool = False) -> np.ndarray:
    """f32 (n, ...) -> f32 (...): the C loop `s = 0; for i: s += terms[i]`, in that order.

    first=True starts from terms[0] instead of 0 + terms[0] (the two differ only for -0.0).
    numpy's own sum is pairwise (and np.add.reduce is for a single column), so the order
    is spelled out: one vectorized add per index, n of them.
    """
    acc = terms[0].copy() if first else terms[0] + np.float32(0)
    for i in range(1, terms.shape[0]):
        np.add(acc, terms[i], out=acc)
    return acc


class BlockKernel(ABC):
    """One GGML block format.  Subclasses set `ggml_type` via the class keyword."""

    ggml_type: ClassVar[GGMLType]
    block_size: ClassVar[int]
    type_size: ClassVar[int]
    # elements per quantize_blocks call on the numpy path (a format whose search loops in
    # Python per index can take larger chunks to spread that overhead)
    quantize_chunk: ClassVar[int] = CHUNK_ELEMENTS

    def __init_subclass__(cls, *, ggml_type: GGMLType, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.ggml_type = ggml_type
        cls.block_size, cls.type_size = BLOCK_GEOMETRY[ggml_type]
        assert ggml_type not in KERNELS, f"{ggml_type} registered twice"
        KERNELS[ggml_type] = cls

    @classmethod
    @abstractmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        """f32 (n_blocks, block_size) -> u8 (n_blocks, type_size)."""

    @classmethod
    @abstractmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """u8 (n_blocks, type_size) -> f32 (n_blocks, block_size), written into `out` if given."""

    @classmethod
    @abstractmethod
    def scale_fields(cls, blocks: np.ndarray) -> list[np.ndarray]:
        """The f16 scale fields of each block, widened to f32 (for finiteness checks)."""

    @classmethod
    def native_quantize(cls, flat: np.ndarray) -> np.ndarray | None:
        """C equivalent of quantize_blocks on all blocks (core.quantization.kquant_c), or None."""
        return None

    @classmethod
    def jit_quantize(cls, flat: np.ndarray) -> np.ndarray | None:
        """Compiled equivalent of quantize_blocks on all blocks, or None if there is none."""
        return None

    @classmethod
    def jit_dequantize(cls, flat: np.ndarray) -> np.ndarray | None:
        """Compiled equivalent of dequantize_blocks on all blocks, or None if there is none."""
        return None

    @classmethod
    def quantize_rows(cls, x: np.ndarray) -> np.ndarray:
        """f32 (rows, n) -> u8 (rows, n // block_size * type_size)."""
        assert x.ndim == 2 and x.dtype == np.float32, (x.shape, x.dtype)
        rows, n = x.shape
        assert n % cls.block_size == 0, (n, cls.block_size)
        flat = np.ascontiguousarray(x).reshape(-1, cls.block_size)  # (n_blocks, block_size)
        if (fast := cls.native_quantize(flat)) is not None:
            return fast.reshape(rows, n // cls.block_size * cls.type_size)
        if numba_codecs.enabled() and (fast := cls.jit_quantize(flat)) is not None:
            return fast.reshape(rows, n // cls.block_size * cls.type_size)
        out = np.empty((flat.shape[0], cls.type_size), dtype=np.uint8)
        step = max(1, cls.quantize_chunk // cls.block_size)
        for start in range(0, flat.shape[0], step):
            out[start:start + step] = cls.quantize_blocks(flat[start:start + step])
        return out.reshape(rows, n // cls.block_size * cls.type_size)

    @classmethod
    def dequantize_rows(cls, data: np.ndarray, n: int) -> np.ndarray:
        """u8 (rows, row_bytes) -> f32 (rows, n)."""
        assert data.ndim == 2 and data.dtype == np.uint8, (data.shape, data.dtype)
        rows = data.shape[0]
        assert data.shape[1] * cls.block_size == n * cls.type_size, (data.shape, n)
        flat = np.ascontiguousarray(data).reshape(-1, cls.type_size)  # (n_blocks, type_size)
        return cls.dequantize_flat(flat).reshape(rows, n)

    @classmethod
    def dequantize_flat(cls, flat: np.ndarray) -> np.ndarray:
        """u8 (n_blocks, type_size) -> f32 (n_blocks, block_size), chunked."""
        if numba_codecs.enabled() and (fast := cls.jit_dequantize(flat)) is not None:
            return fast
        out = np.empty((flat.shape[0], cls.block_size), dtype=np.float32)
        step = max(1, CHUNK_ELEMENTS // cls.block_size)
        for start in range(0, flat.shape[0], step):
            cls.dequantize_blocks(flat[start:start + step], out=out[start:start + step])
        return out
