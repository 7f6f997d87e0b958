"""MXFP4 experts on the CPU: the C kernels (every variant this CPU runs), the numba kernels and the
backend's paths, against the numpy codec (core/quantization/mxfp4.py, itself bit-exact to gguf-py).

As for Q8_0 (test_quant_matmul.py), the C matmuls quantize the activations to int8 blocks of 32
first; `quantized_x` rebuilds that quantization bit for bit, so the C result is compared with an
f64 product of exactly what the kernel multiplies, within f32 accumulation error, and with the
f32 product within the activation-rounding bound derived there. Weights are random *valid* blocks:
every code in every nibble, E8M0 scales around 2^0 plus the edge exponents.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.experts import numba_matmul
from core.experts.backends import CpuBackend, CpuWeight, TensorIn, quant_matmul_variants
from core.quantization import mxfp4
from core.quantization.f16 import F16_TO_F32
from core.quantization.registry import dequantize, quantize
from testkit.blocks import random_blocks
from tests.experts.factories import bit_report, expert_weights, swiglu_reference
from tests.experts.test_quant_matmul import C_RTOL, c_dequantize, c_expert, c_matmul, quantized_x

VARIANTS = quant_matmul_variants()
needs_c = pytest.mark.skipif(not VARIANTS, reason="C kernels not built (pip install -e . compiles them)")
# the E8M0 bytes with a story (tests/quantization/test_mxfp4_type.py); from 253 on d·12 is inf
E8M0_EDGES = np.array([0, 1, 2, 126, 127, 128, 252, 253, 254, 255], dtype=np.uint8)
# int8 activations in blocks of 32, as for Q8_0: ~0.5% of the largest output of one matmul
# (test_quant_matmul.test_c_from_gguf_quantizer), ~1.2% of an expert's output (test_ffn)
ACT_RTOL = 1e-2
# all-MXFP4 expert against its f32 originals: gguf's rule leaves an rms error of ~11.5% of a
# Gaussian weight's rms (coarse E2M1 grid, scale set from the block's top binade), so ~11.5% per
# projection; three in series add in quadrature, ~20%: measured 19.7-21.2% over 5 seeds
WEIGHT_BOUND = 0.25
# the C fused expert against the f64 forward of its own dequantized weights: test_ffn.py's bound
# for Q8_0 experts (C_KERNEL_BOUNDS["q8_0"]), whose activations are the same int8 blocks of 32
C_EXPERT_BOUND = 0.02


def mxfp4_blocks(rng: np.random.Generator, rows: int, n: int, edges: bool = False) -> np.ndarray:
    """u8 [rows, n/32·17]: random codes; E8M0 scales 2^-9..2^3 (weights ~0.002..96), or with
    `edges` every fifth block given one of E8M0_EDGES in turn."""
    raw = rng.integers(0, 256, (rows, n // 32, 17), dtype=np.uint8)
    raw[:, :, 0] = rng.integers(119, 132, (rows, n // 32))
    if edges:
        e = raw[:, :, 0].reshape(-1)
        picks = np.arange(0, e.size, 5)
        e[picks] = E8M0_EDGES[np.arange(picks.size) % E8M0_EDGES.size]
    return raw.reshape(rows, -1)


def numpy_weights(blocks: np.ndarray) -> np.ndarray:
    """f32 [rows, n]: the numpy codec's decoding, the reference."""
    rows = blocks.shape[0]
    with np.errstate(over="ignore"):
        return mxfp4.dequantize_blocks(blocks.reshape(-1, 17)).reshape(rows, -1)


def _rel_max(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def _rel(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


# --- dequantizers --------------------------------------------------------------------------------


@needs_c
@pytest.mark.parametrize("variant", VARIANTS)
def test_c_dequantize_bit_exact(variant):
    """Random blocks with every E8M0 edge (subnormal scales, e = 253-255's infinities), an odd
    block count, odd row ranges, one and two threads."""
    rng = np.random.default_rng(60)
    m, n = 37, 800
    blocks = mxfp4_blocks(rng, m, n, edges=True)
    ref = numpy_weights(blocks)
    assert not np.isfinite(ref).all() and (np.abs(ref[ref != 0]) < 2.0 ** -126).any()  # both edges present
    for r0, r1 in ((0, m), (3, 36), (36, 37), (5, 5)):
        for threads in (1, 2):
            out = c_dequantize("MXFP4", blocks, n, r0, r1, variant, threads)
            assert np.array_equal(out.view(np.uint32), ref[r0:r1].view(np.uint32)), (
                f"{variant} rows {r0}..{r1}: " + bit_report(out, ref[r0:r1]))


def test_numba_dequant_rows_bit_exact():
    rng = np.random.default_rng(61)
    blocks = mxfp4_blocks(rng, 24, 512, edges=True)
    ref = numpy_weights(blocks)
    out = np.empty((16, 512), dtype=np.float32)
    numba_matmul.DEQUANT_ROWS["MXFP4"](blocks, 5, F16_TO_F32, out)
    assert np.array_equal(out.view(np.uint32), ref[5:21].view(np.uint32)), bit_report(out, ref[5:21])


# --- matmuls -------------------------------------------------------------------------------------


@needs_c
@pytest.mark.parametrize("variant", VARIANTS)
def test_c_matmul_matches_reference(variant):
    """Batch 1..9 (token chunks of 4 or 8 plus a remainder), 45 rows (not a multiple of the 32-row
    tile), 25 blocks a row (the kernel steps two), subnormal scales among them; one and two threads."""
    rng = np.random.default_rng(62)
    m, n = 45, 800
    blocks = mxfp4_blocks(rng, m, n)
    picked = blocks.reshape(m, -1, 17)[::3, ::4, 0]  # a view: every third row, every fourth block
    picked[...] = np.resize(E8M0_EDGES[:3], picked.shape[1])  # d 2^-128, 2^-127, 2^-126: ~0 terms
    assert (blocks.reshape(m, -1, 17)[:, :, 0] < 3).sum() == picked.size
    w = numpy_weights(blocks).astype(np.float64)
    for t in range(1, 10):
        x = rng.standard_normal((t, n)).astype(np.float32)
        exact = quantized_x("Q8_0", x) @ w.T  # the same activation blocks as Q8_0's
        f32 = x.astype(np.float64) @ w.T
        for threads in (1, 2):
            y = c_matmul("MXFP4", blocks, x, variant, threads)
            assert y.shape == (t, m) and y.dtype == np.float32
            assert _rel_max(y, exact) < C_RTOL, f"{variant} t={t} threads={threads}"
            assert _rel_max(y, f32) < ACT_RTOL, f"{variant} t={t} threads={threads}"


@needs_c
def test_c_variants_agree():
    """The same integer block sums in every variant; only the f32 summation order differs."""
    rng = np.random.default_rng(63)
    blocks = mxfp4_blocks(rng, 70, 1024)
    x = rng.standard_normal((6, 1024)).astype(np.float32)
    base = c_matmul("MXFP4", blocks, x, "scalar")
    for variant in VARIANTS:
        assert _rel_max(c_matmul("MXFP4", blocks, x, variant), base) < C_RTOL, variant


@pytest.mark.parametrize("t", [1, 3, 16])
def test_numba_matmul_matches_reference(t):
    rng = np.random.default_rng(64)
    blocks = mxfp4_blocks(rng, 40, 800)
    x = rng.standard_normal((t, 800)).astype(np.float32)
    y = np.empty((t, 40), dtype=np.float32)
    numba_matmul.MATMUL["MXFP4"](blocks, x, F16_TO_F32, y)
    assert _rel_max(y, x.astype(np.float64) @ numpy_weights(blocks).astype(np.float64).T) < 1e-5


@pytest.mark.parametrize("kernels_", ["c", "numba", "numpy"])
def test_backend_matmul_paths(kernels_):
    """CpuBackend.matmul, fused at small batch and tiled above, on each kernel set; the tiles (C or
    numba dequantizer, or numpy's) and numba's fused kernel keep f32 activations: f32 rounding only."""
    if kernels_ == "c" and not VARIANTS:
        pytest.skip("C kernels not built")
    rng = np.random.default_rng(65)
    m, n = 300, 512
    blocks = mxfp4_blocks(rng, m, n)
    w = CpuWeight("MXFP4", (m, n), blocks)
    ref_w = numpy_weights(blocks).astype(np.float64)
    backend = {"c": CpuBackend(fused_max_rows=4), "numba": CpuBackend(fused_max_rows=4, c_variant="off"),
               "numpy": CpuBackend(use_numba=False)}[kernels_]
    for t in (1, 4, 5, 40):
        x = rng.standard_normal((t, n)).astype(np.float32)
        y = backend.matmul(x, w)
        assert y.shape == (t, m) and y.dtype == np.float32
        c_fused = kernels_ == "c" and t <= 4
        assert _rel_max(y, x.astype(np.float64) @ ref_w.T) < (ACT_RTOL if c_fused else 1e-5), (kernels_, t)


# --- the fused expert call --------------------------------------------------------------------------


@needs_c
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmts", [("MXFP4", "MXFP4"), ("MXFP4", "Q6_K"), ("Q4_K", "MXFP4"), ("Q8_0", "MXFP4")])
def test_c_expert_matches_parts(fmts, variant):
    """One `expert` call = gate|up matmul, silu·up, down matmul, for MXFP4 on either side (the
    other side's activation blocks of 256 or 32 in the same scratch), batches 1..9, the pool forced."""
    rng = np.random.default_rng(66)
    d_model, d_ff = 512, 256

    def weights(fmt: str, rows: int, n: int) -> np.ndarray:
        return mxfp4_blocks(rng, rows, n) if fmt == "MXFP4" else random_blocks(rng, fmt, rows, n)

    gu, down = weights(fmts[0], 2 * d_ff, d_model), weights(fmts[1], d_model, d_ff)
    for t in range(1, 10):
        x = rng.standard_normal((t, d_model)).astype(np.float32)
        g_u = c_matmul(fmts[0], gu, x, variant).astype(np.float64)
        g, u = g_u[:, :d_ff], g_u[:, d_ff:]
        with np.errstate(over="ignore"):
            h = (g / (1 + np.exp(-g)) * u).astype(np.float32)
        ref = c_matmul(fmts[1], down, h, variant)
        for threads in (1, 2):
            y = c_expert(fmts, gu, down, x, variant, threads, min_macs=1)
            assert y.shape == (t, d_model) and np.isfinite(y).all()
            assert _rel(y, ref) < 1e-4, f"{fmts} {variant} t={t} threads={threads}"


@needs_c
def test_c_rejects_bad_mxfp4_arguments():
    from core.experts import _quant_matmul

    blocks = mxfp4_blocks(np.random.default_rng(67), 4, 256)
    x, y = np.zeros((1, 256), np.float32), np.zeros((1, 4), np.float32)
    _quant_matmul.matmul("MXFP4", blocks, 4, 256, x, 1, y, "scalar", 1)  # the valid call
    with pytest.raises(ValueError, match="buffer sizes"):
        _quant_matmul.matmul("MXFP4", blocks[:3], 4, 256, x, 1, y, "scalar", 1)
    with pytest.raises(ValueError, match="bad shape"):
        _quant_matmul.matmul("MXFP4", blocks, 4, 250, x, 1, y, "scalar", 1)
    with pytest.raises(ValueError, match=r"unknown format MXFP6 \(Q8_0, Q4_K, Q6_K, MXFP4\)"):
        _quant_matmul.matmul("MXFP6", blocks, 4, 256, x, 1, y, "scalar", 1)
    with pytest.raises(ValueError, match="buffer sizes"):  # Q8_0's row size is not MXFP4's
        _quant_matmul.matmul("Q8_0", blocks, 4, 256, x, 1, y, "scalar", 1)


# --- CpuBackend.forward on an all-MXFP4 expert -----------------------------------------------------


def _expert(backend: CpuBackend, w: dict[str, np.ndarray]):
    tensors = [TensorIn("MXFP4", w[p].shape, quantize(w[p], "MXFP4")) for p in ("gate", "up", "down")]
    stored = {p: dequantize(t.data, "MXFP4", t.shape) for p, t in zip(("gate", "up", "down"), tensors, strict=True)}
    return backend.prepare_expert(*tensors), stored


@pytest.mark.parametrize("path", ["default", "tiled", "numba", "numpy"] + [f"c-{v}" for v in VARIANTS])
@pytest.mark.parametrize("t", [1, 8, 200])
def test_forward_all_mxfp4(path, t):
    """An expert quantized to MXFP4 (gpt-oss's width ratio, small dims) against the f64 SwiGLU of
    its dequantized weights: the C fused path (batches up to fused_max_rows; 200 takes the tiles)
    within the int8 activations' bound for Q8_0 experts (same 32-value blocks), every other path
    within f32 rounding; and against the f32 originals within MXFP4's own error."""
    backend = {"default": lambda: CpuBackend(), "tiled": lambda: CpuBackend(fused_max_rows=0),
               "numba": lambda: CpuBackend(c_variant="off"), "numpy": lambda: CpuBackend(use_numba=False)}.get(
        path, lambda: CpuBackend(c_variant=path.removeprefix("c-")))()
    rng = np.random.default_rng(68)
    w = expert_weights(rng, 320, 320)
    prepared, stored = _expert(backend, w)
    assert prepared.gate_up[0].ggml_type == "MXFP4" and prepared.nbytes == 3 * 320 * 10 * 17
    x = rng.standard_normal((t, 320)).astype(np.float32)
    y = backend.forward(prepared, x)
    assert y.shape == (t, 320) and y.dtype == np.float32
    c_fused = backend.cpu_kernel.startswith("c-") and t <= backend.fused_max_rows
    assert _rel(y, swiglu_reference(stored, x)) < (C_EXPERT_BOUND if c_fused else 1e-5)
    assert _rel(y, swiglu_reference(w, x)) < WEIGHT_BOUND
