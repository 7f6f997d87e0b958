"""The numba block kernels (core/experts/numba_matmul.py) and the CPU backend's paths against
gguf-py's dequantizer (the reference for all three layouts).

Weights are random *valid* blocks (arbitrary quant bytes and scale bytes, finite f16 d/dmin),
which exercises every bit of every packed field, not just what a quantizer happens to emit.
The C kernels have their own tests (test_quant_matmul.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from core.experts import numba_matmul
from core.experts.backends import CpuBackend, CpuWeight, quant_matmul_variants
from core.quantization.f16 import F16_TO_F32
from testkit.blocks import random_blocks
from tests.experts.factories import bit_report, reference_weights

FORMATS = ["Q8_0", "Q4_K", "Q6_K"]
RTOL = 1e-5  # f32 accumulation in a different order than the f64 reference


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_rows_bit_exact(fmt):
    rng = np.random.default_rng(10)
    blocks = random_blocks(rng, fmt, 24, 512)
    ref = reference_weights(fmt, blocks)
    out = np.empty((16, 512), dtype=np.float32)
    numba_matmul.DEQUANT_ROWS[fmt](blocks, 5, F16_TO_F32, out)
    assert np.array_equal(out, ref[5:21]), bit_report(out, ref[5:21])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t", [1, 3, 16])
def test_fused_matmul_matches_reference(fmt, t):
    rng = np.random.default_rng(11)
    blocks = random_blocks(rng, fmt, 40, 768)
    x = rng.standard_normal((t, 768)).astype(np.float32)
    y = np.empty((t, 40), dtype=np.float32)
    numba_matmul.MATMUL[fmt](blocks.view(np.int8) if fmt == "Q8_0" else blocks, x, F16_TO_F32, y)
    ref = x.astype(np.float64) @ reference_weights(fmt, blocks).astype(np.float64).T
    err = np.abs(y - ref).max() / np.abs(ref).max()
    assert err < RTOL, f"{fmt} t={t}: max error {err:.2e} of the largest output"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kernels_", ["numba", "numpy", "c"])
@pytest.mark.parametrize("tile_bytes", [None, 100_000])
def test_backend_paths_agree(fmt, kernels_, tile_bytes, monkeypatch):
    """Fused (small batch) and tiled (large batch) paths, with numba, without compiled kernels,
    and with the C dequantizer under the tiles (the C fused kernels, which quantize the
    activations, are tested against their own reference below). tile_bytes 100_000: 300 rows
    of 2 KiB in 7 tiles of 43 rows, the last one 42; None: one tile."""
    from core.experts import backends

    if kernels_ == "c" and not quant_matmul_variants():
        pytest.skip("C kernels not built")
    if tile_bytes is not None:
        monkeypatch.setattr(backends, "_TILE_BYTES", tile_bytes)
    rng = np.random.default_rng(12)
    m, n = 300, 512
    blocks = random_blocks(rng, fmt, m, n)
    w = CpuWeight(fmt, (m, n), blocks)
    ref_w = reference_weights(fmt, blocks).astype(np.float64)
    if kernels_ == "c":  # fused_max_rows 0: every batch takes the tiles
        backend = CpuBackend(fused_max_rows=0)
    else:
        backend = CpuBackend(use_numba=kernels_ == "numba", fused_max_rows=4, c_variant="off")
    for t in (1, 4, 5, 40):
        x = rng.standard_normal((t, n)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_w.T
        # x in either order: the tiles hand it to BLAS as given, the fused kernels copy it
        for xo in (x, np.asfortranarray(x)):
            y = backend.matmul(xo, w)
            assert y.shape == (t, m) and y.dtype == np.float32
            err = np.abs(y - ref).max() / np.abs(ref).max()
            assert err < RTOL, f"{fmt} t={t} {kernels_}: max error {err:.2e}"


def test_tile_rows():
    """Whole matrix when it fits the budget, else equal tiles under it that cover every row."""
    from core.experts.backends import _TILE_BYTES, _tile_rows

    assert _tile_rows(1536, 2048) == 1536  # Qwen3 gate|up, 12 MiB: one sgemm
    assert _tile_rows(2048, 768) == 2048
    for m, n in ((4096, 7168), (7168, 2048), (1, 1 << 24), (7, 1 << 22), (100_000, 256)):
        rows = _tile_rows(m, n)
        tiles = -(-m // rows)
        assert 1 <= rows <= m and (rows * n * 4 <= _TILE_BYTES or rows == 1), (m, n, rows)
        assert m - (tiles - 1) * rows >= rows - tiles, (m, n, rows)  # the last tile is not a sliver
    assert _tile_rows(4096, 7168) >= 1024  # DeepSeek-V3 gate|up: large enough for sgemm


def test_q8_0_from_gguf_quantizer():
    """Real Q8_0 blocks (gguf-py's bit-exact port of ggml's quantizer)."""
    rng = np.random.default_rng(13)
    dense = rng.standard_normal((64, 256)).astype(np.float32)
    blocks = quants.quantize(dense, GGMLQuantizationType.Q8_0)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    y = np.empty((2, 64), dtype=np.float32)
    numba_matmul.q8_0_matmul(blocks.view(np.int8), x, F16_TO_F32, y)
    ref = x.astype(np.float64) @ quants.dequantize(blocks, GGMLQuantizationType.Q8_0).astype(np.float64).T
    assert np.abs(y - ref).max() / np.abs(ref).max() < RTOL
