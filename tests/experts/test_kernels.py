"""The numba block kernels against gguf-py's dequantizer (the reference for all three layouts).

Weights are random *valid* blocks (arbitrary quant bytes and scale bytes, finite f16 d/dmin),
which exercises every bit of every packed field, not just what a quantizer happens to emit.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from apps.experts import kernels
from apps.experts.backends import CpuBackend, CpuWeight

FORMATS = ["Q8_0", "Q4_K", "Q6_K"]
F16_FIELDS = {"Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}  # byte offsets of f16 d / dmin in a block
RTOL = 1e-5  # f32 accumulation in a different order than the f64 reference


def random_blocks(rng: np.random.Generator, fmt: str, rows: int, n: int) -> np.ndarray:
    """u8 [rows, row_bytes] of random blocks with finite, small f16 scales."""
    elems, size = kernels.BLOCK[fmt]
    raw = rng.integers(0, 256, size=(rows, n // elems, size), dtype=np.uint8)
    for off in F16_FIELDS[fmt]:
        scale = (rng.standard_normal((rows, n // elems)) * 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, n // elems, 2)
    return raw.reshape(rows, -1)


def reference_weights(fmt: str, blocks: np.ndarray) -> np.ndarray:
    return quants.dequantize(blocks, getattr(GGMLQuantizationType, fmt)).astype(np.float32)


def _report(ours: np.ndarray, ref: np.ndarray) -> str:
    diff = ours.view(np.uint32) != ref.view(np.uint32)
    return f"{int(diff.sum())} of {diff.size} values differ in their bits"


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_rows_bit_exact(fmt):
    rng = np.random.default_rng(10)
    blocks = random_blocks(rng, fmt, 24, 512)
    ref = reference_weights(fmt, blocks)
    out = np.empty((16, 512), dtype=np.float32)
    kernels.DEQUANT_ROWS[fmt](blocks, 5, kernels.f16_lut(), out)
    assert np.array_equal(out, ref[5:21]), _report(out, ref[5:21])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t", [1, 3, 16])
def test_fused_matmul_matches_reference(fmt, t):
    rng = np.random.default_rng(11)
    blocks = random_blocks(rng, fmt, 40, 768)
    x = rng.standard_normal((t, 768)).astype(np.float32)
    y = np.empty((t, 40), dtype=np.float32)
    kernels.MATMUL[fmt](blocks.view(np.int8) if fmt == "Q8_0" else blocks, x, kernels.f16_lut(), y)
    ref = x.astype(np.float64) @ reference_weights(fmt, blocks).astype(np.float64).T
    err = np.abs(y - ref).max() / np.abs(ref).max()
    assert err < RTOL, f"{fmt} t={t}: max error {err:.2e} of the largest output"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("use_numba", [True, False])
def test_backend_paths_agree(fmt, use_numba):
    """Fused (small batch) and tiled (large batch) paths, with and without numba."""
    rng = np.random.default_rng(12)
    m, n = 300, 512  # 300 rows: the last tile is partial
    blocks = random_blocks(rng, fmt, m, n)
    w = CpuWeight(fmt, (m, n), blocks)
    ref_w = reference_weights(fmt, blocks).astype(np.float64)
    backend = CpuBackend(use_numba=use_numba, fused_max_rows=4)
    for t in (1, 4, 5, 40):
        x = rng.standard_normal((t, n)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_w.T
        err = np.abs(backend.matmul(x, w) - ref).max() / np.abs(ref).max()
        assert err < RTOL, f"{fmt} t={t} numba={use_numba}: max error {err:.2e}"


def test_q8_0_from_gguf_quantizer():
    """Real Q8_0 blocks (gguf-py's bit-exact port of ggml's quantizer)."""
    rng = np.random.default_rng(13)
    dense = rng.standard_normal((64, 256)).astype(np.float32)
    blocks = quants.quantize(dense, GGMLQuantizationType.Q8_0)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    y = np.empty((2, 64), dtype=np.float32)
    kernels.q8_0_matmul(blocks.view(np.int8), x, kernels.f16_lut(), y)
    ref = x.astype(np.float64) @ quants.dequantize(blocks, GGMLQuantizationType.Q8_0).astype(np.float64).T
    assert np.abs(y - ref).max() / np.abs(ref).max() < RTOL


def test_f16_lut_is_exact():
    lut = kernels.f16_lut()
    finite = np.isfinite(np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16))
    ref = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    assert np.array_equal(lut[finite], ref[finite])
