"""Naive min/max encoders in the Q4_K and Q6_K layouts: the baseline the searched scales beat.

Same bytes layout and the same decode as q4_k/q6_k; only the per-sub-block scale choice
differs: Q4_K takes scale = (max - min) / 15 and min = min(x, 0); Q6_K takes the
symmetric scale = max|x| / 31 (levels -31..31; no search, no use of the extra -32 level).
Used by the tests and bench/quant.py.  Pure module, never Django.
"""

from __future__ import annotations

import numpy as np

from .q4_k import Q4_K
from .q6_k import Q6_K
from .types import GGMLType


def naive_q4_k(x: np.ndarray) -> np.ndarray:
    """f32 [rows, n] (n % 256 == 0) -> u8 [rows, n/256*144] with min/max scales."""
    rows = x.shape[0]
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 8, 32)
    lo = np.minimum(blocks.min(axis=-1), np.float32(0))
    scales = (blocks.max(axis=-1) - lo) / np.float32(15)
    return Q4_K.encode(blocks, scales.astype(np.float32), (-lo).astype(np.float32)).reshape(rows, -1)


def naive_q6_k(x: np.ndarray) -> np.ndarray:
    """f32 [rows, n] (n % 256 == 0) -> u8 [rows, n/256*210] with symmetric amax/31 scales."""
    rows = x.shape[0]
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 16, 16)
    scales = np.abs(blocks).max(axis=-1) / np.float32(31)
    return Q6_K.encode(blocks, scales.astype(np.float32)).reshape(rows, -1)


NAIVE = {GGMLType.Q4_K: naive_q4_k, GGMLType.Q6_K: naive_q6_k}
