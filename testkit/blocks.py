"""Random GGML blocks with sane scales, for kernel tests and benchmarks."""

from __future__ import annotations

import numpy as np

from core.quantization.types import GGMLType

F16_FIELDS = {"Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}  # byte offsets of f16 d / dmin in a block


def random_blocks(rng: np.random.Generator, fmt: str, rows: int, n: int) -> np.ndarray:
    """u8 [rows, row_bytes] of random blocks with finite, small f16 scales."""
    elems, size = GGMLType(fmt).block_size, GGMLType(fmt).type_size
    raw = rng.integers(0, 256, size=(rows, n // elems, size), dtype=np.uint8)
    for off in F16_FIELDS[fmt]:
        scale = (rng.standard_normal((rows, n // elems)) * 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, n // elems, 2)
    return raw.reshape(rows, -1)
