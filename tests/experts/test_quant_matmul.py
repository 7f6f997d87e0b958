"""The C kernels for quantized experts (core/experts/_quant_matmul.c): fused matmuls, the
whole-expert entry point and the row dequantizer, every ISA variant this CPU runs.

The C kernels quantize the activations to int8 first; `quantized_x` rebuilds that
quantization in numpy bit for bit, so the C result is compared with an f64 product of exactly
what the kernel multiplies, within f32 accumulation error.  The dequantizer is compared with
gguf-py's decoder bit for bit.  Weights are random *valid* blocks (every bit of every packed
field), plus edge-value scales.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from core.experts.backends import CpuBackend, CpuWeight, quant_matmul_variants
from core.quantization.types import GGMLType
from testkit.blocks import F16_FIELDS, random_blocks
from tests.experts.factories import bit_report, reference_weights, run_in_threads

FORMATS = ["Q8_0", "Q4_K", "Q6_K"]


VARIANTS = quant_matmul_variants()
needs_c = pytest.mark.skipif(not VARIANTS, reason="C kernels not built (pip install -e . compiles them)")
ACT_BLOCK = {"Q8_0": 32, "Q4_K": 256, "Q6_K": 256}
C_RTOL = 1e-5  # f32 accumulation of exact integer block sums, vs an f64 reference


def quantized_x(fmt: str, x: np.ndarray) -> np.ndarray:
    """f64 [t, n]: x as the C kernels see it, rebuilt with the same f32 operations.

    Per activation block (32 values for Q8_0, 256 for the K-quants): d = amax/127 and
    q = rint(x/d) (half to even) in [-127, 127], llama.cpp's Q8_0 / Q8_K activations.
    """
    t, n = x.shape
    block = ACT_BLOCK[fmt]
    xb = x.reshape(t, n // block, block)
    d = np.abs(xb).max(axis=2, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv)
    assert np.abs(q).max() <= 127
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(t, n)


def c_matmul(fmt: str, blocks: np.ndarray, x: np.ndarray, variant: str, threads: int = 1) -> np.ndarray:
    """The extension called directly (the backend would run matmuls this small on one thread)."""
    from core.experts import _quant_matmul

    (t, n), m = x.shape, blocks.shape[0]
    y = np.empty((t, m), dtype=np.float32)
    _quant_matmul.matmul(fmt, np.ascontiguousarray(blocks), m, n, np.ascontiguousarray(x), t, y, variant, threads)
    return y


def _rel_max(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


@needs_c
def test_variants_and_cpu_kernel(monkeypatch):
    assert VARIANTS[-1] == "scalar"
    for variant in VARIANTS:
        assert CpuBackend(c_variant=variant).cpu_kernel == f"c-{variant}"
    assert CpuBackend().cpu_kernel == f"c-{VARIANTS[0]}"  # the best one by default
    monkeypatch.setenv("TENZRO_QDOT_VARIANT", "scalar")
    assert CpuBackend().cpu_kernel == "c-scalar"
    assert CpuBackend(c_variant="off").cpu_kernel.startswith("numba-")
    # through the backend: the fused path at small batch, 2 threads for a big enough matmul
    rng = np.random.default_rng(35)
    blocks = random_blocks(rng, "Q4_K", 512, 2048)
    x = rng.standard_normal((2, 2048)).astype(np.float32)
    ref = quantized_x("Q4_K", x) @ reference_weights("Q4_K", blocks).astype(np.float64).T
    y = CpuBackend(threads=2).matmul(x, CpuWeight("Q4_K", (512, 2048), blocks))
    assert _rel_max(y, ref) < C_RTOL
    assert CpuBackend(use_numba=False).cpu_kernel == "numpy-tiled"
    with pytest.raises(ValueError, match="not available"):
        CpuBackend(c_variant="sse9")


@needs_c
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_c_matmul_matches_reference(fmt, variant):
    """Every ISA variant, batch 1..9 (token chunks of 4 or 8 plus a remainder), 45 rows (not a
    multiple of the 32-row tile), Q8_0 with an odd block count (the kernel steps two blocks),
    one and two threads."""
    rng = np.random.default_rng(30)
    m, n = 45, (800 if fmt == "Q8_0" else 768)
    blocks = random_blocks(rng, fmt, m, n)
    w = reference_weights(fmt, blocks).astype(np.float64)
    for t in range(1, 10):
        x = rng.standard_normal((t, n)).astype(np.float32)
        ref = quantized_x(fmt, x) @ w.T
        for threads in (1, 2):
            y = c_matmul(fmt, blocks, x, variant, threads)
            assert y.shape == (t, m) and y.dtype == np.float32
            err = _rel_max(y, ref)
            assert err < C_RTOL, f"{fmt} {variant} t={t} threads={threads}: max error {err:.2e}"


@needs_c
@pytest.mark.parametrize("fmt", FORMATS)
def test_c_variants_agree(fmt):
    """Same integer block sums in every variant; only the f32 summation order differs."""
    rng = np.random.default_rng(31)
    blocks = random_blocks(rng, fmt, 70, 1024)
    x = rng.standard_normal((6, 1024)).astype(np.float32)
    base = c_matmul(fmt, blocks, x, "scalar")
    for variant in VARIANTS:
        assert _rel_max(c_matmul(fmt, blocks, x, variant), base) < C_RTOL, variant


@needs_c
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_c_zeros_and_outliers(fmt, variant):
    rng = np.random.default_rng(32)
    m, n = 33, 512
    blocks = random_blocks(rng, fmt, m, n)
    w = reference_weights(fmt, blocks).astype(np.float64)
    zeros = np.zeros((3, n), dtype=np.float32)
    assert not c_matmul(fmt, blocks, zeros, variant).any()  # d = 0 blocks give exact zeros
    # one huge value per row: its block's scale is set by it and the rest of that block rounds
    # to zero, which is what the reference quantizer says too; nothing overflows
    x = rng.standard_normal((3, n)).astype(np.float32)
    x[0, 5], x[1, 300], x[2, -1] = 1e30, -3e29, 1e25
    y = c_matmul(fmt, blocks, x, variant)
    assert np.isfinite(y).all()
    assert _rel_max(y, quantized_x(fmt, x) @ w.T) < C_RTOL
    # the outlier itself is represented exactly up to f32 rounding, so y ~ the f64 product
    assert _rel_max(y, x.astype(np.float64) @ w.T) < 1e-5


@needs_c
def test_c_from_gguf_quantizer_and_threads():
    """Real Q8_0 blocks, and two Python threads calling the kernel at once (the GIL is
    released inside, so they really overlap) get the same answers as alone."""
    rng = np.random.default_rng(33)
    dense = rng.standard_normal((256, 512)).astype(np.float32)
    blocks = quants.quantize(dense, GGMLQuantizationType.Q8_0)
    xs = [rng.standard_normal((t, 512)).astype(np.float32) for t in (1, 5)]
    alone = [c_matmul("Q8_0", blocks, x, VARIANTS[0], threads=2) for x in xs]
    w = quants.dequantize(blocks, GGMLQuantizationType.Q8_0).astype(np.float64)
    for x, y in zip(xs, alone, strict=True):
        assert _rel_max(y, quantized_x("Q8_0", x) @ w.T) < C_RTOL
        # int8 activations in blocks of 32: an rms rounding error of amax/(127·sqrt(12)) ~ 0.5% of
        # an element's rms, so ~0.5% of a typical output, ~1.7% at 3.5 sigma over these outputs,
        # i.e. ~0.5% of the largest output; measured 0.48%
        assert _rel_max(y, x.astype(np.float64) @ w.T) < 1e-2
    results = run_in_threads(lambda i: [c_matmul("Q8_0", blocks, x, VARIANTS[0], threads=2) for x in xs * 20])
    for per_thread in results:
        for k, y in enumerate(per_thread):
            assert np.array_equal(y, alone[k % 2])


@needs_c
def test_c_rejects_bad_arguments():
    from core.experts import _quant_matmul

    blocks = random_blocks(np.random.default_rng(34), "Q4_K", 4, 256)
    x = np.zeros((1, 256), np.float32)
    y = np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match="buffer sizes"):
        _quant_matmul.matmul("Q4_K", blocks[:3], 4, 256, x, 1, y, "scalar", 1)
    with pytest.raises(ValueError, match="unknown format"):
        _quant_matmul.matmul("Q5_K", blocks, 4, 256, x, 1, y, "scalar", 1)
    with pytest.raises(ValueError, match="unsupported"):
        _quant_matmul.matmul("Q4_K", blocks, 4, 256, x, 1, y, "neon", 1)
    with pytest.raises(ValueError, match="bad shape"):
        _quant_matmul.matmul("Q4_K", blocks, 4, 200, x, 1, y, "scalar", 1)


# --- the fused expert entry point (_quant_matmul.expert) -------------------------------------------------

EXPERT_FORMATS = [("Q8_0", "Q8_0"), ("Q4_K", "Q6_K"), ("Q6_K", "Q4_K")]


def c_expert(fmts: tuple[str, str], gu: np.ndarray, down: np.ndarray, x: np.ndarray, variant: str,
             threads: int = 1, min_macs: int = 0) -> np.ndarray:
    from core.experts import _quant_matmul

    (t, d_model), d_ff = x.shape, gu.shape[0] // 2
    y = np.empty((t, d_model), dtype=np.float32)
    _quant_matmul.expert(fmts[0], gu, fmts[1], down, d_model, d_ff, np.ascontiguousarray(x), t, y, variant, threads,
                         min_macs)
    return y


def expert_by_parts(fmts: tuple[str, str], gu: np.ndarray, down: np.ndarray, x: np.ndarray,
                    variant: str) -> np.ndarray:
    """The same computation from single matmul calls and numpy's silu."""
    d_ff = gu.shape[0] // 2
    g_u = c_matmul(fmts[0], gu, x, variant)
    g, u = g_u[:, :d_ff].astype(np.float64), g_u[:, d_ff:].astype(np.float64)
    with np.errstate(over="ignore"):  # e^-g -> inf for g << 0: silu -> -0.0, the right limit
        h = (g / (1 + np.exp(-g)) * u).astype(np.float32)
    return c_matmul(fmts[1], down, h, variant)


@needs_c
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmts", EXPERT_FORMATS)
def test_c_expert_matches_parts(fmts, variant):
    """One call = gate|up matmul, silu·up, down matmul, for every variant, batches 1..9, one
    and two threads (min_macs 1 forces the pool). h is rounded to f32 by C's expf rather than
    numpy's f64 exp, which can move an int8 rounding by one step: a ~1e-6 relative effect."""
    rng = np.random.default_rng(36)
    d_model, d_ff = (800, 96) if fmts[0] == "Q8_0" else (512, 256)  # 800/32: odd Q8_0 block count
    gu = random_blocks(rng, fmts[0], 2 * d_ff, d_model)
    down = random_blocks(rng, fmts[1], d_model, d_ff)
    for t in range(1, 10):
        x = rng.standard_normal((t, d_model)).astype(np.float32)
        ref = expert_by_parts(fmts, gu, down, x, variant)
        for threads in (1, 2):
            y = c_expert(fmts, gu, down, x, variant, threads, min_macs=1)
            assert y.shape == (t, d_model) and np.isfinite(y).all()
            err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
            assert err < 1e-4, f"{fmts} {variant} t={t} threads={threads}: error {err:.2e}"


@needs_c
def test_c_expert_threads_and_fork():
    """Two Python threads driving the expert kernel at once (one gets the pool, the other runs
    on its own thread) agree with a lone call; a forked child (Celery prefork) has no pool
    workers and must start its own rather than wait for the parent's."""
    import multiprocessing

    rng = np.random.default_rng(37)
    fmts = ("Q8_0", "Q8_0")
    gu, down = random_blocks(rng, "Q8_0", 512, 1024), random_blocks(rng, "Q8_0", 1024, 256)
    xs = [rng.standard_normal((t, 1024)).astype(np.float32) for t in (1, 6)]
    alone = [c_expert(fmts, gu, down, x, VARIANTS[0], threads=2, min_macs=1) for x in xs]
    results = run_in_threads(
        lambda i: [c_expert(fmts, gu, down, x, VARIANTS[0], threads=2, min_macs=1) for x in xs * 20])
    for per_thread in results:
        for k, y in enumerate(per_thread):
            assert np.array_equal(y, alone[k % 2])
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as child:
        y = child.apply_async(c_expert, (fmts, gu, down, xs[1], VARIANTS[0], 2, 1)).get(timeout=60)
    assert np.array_equal(y, alone[1])


@needs_c
def test_c_expert_rejects_bad_arguments():
    from core.experts import _quant_matmul

    rng = np.random.default_rng(38)
    gu, down = random_blocks(rng, "Q4_K", 512, 256), random_blocks(rng, "Q6_K", 256, 256)
    x, y = np.zeros((2, 256), np.float32), np.zeros((2, 256), np.float32)
    _quant_matmul.expert("Q4_K", gu, "Q6_K", down, 256, 256, x, 2, y, "scalar", 1, 0)  # the valid call
    with pytest.raises(ValueError, match="buffer sizes"):
        _quant_matmul.expert("Q4_K", gu[:511], "Q6_K", down, 256, 256, x, 2, y, "scalar", 1, 0)
    with pytest.raises(ValueError, match="buffer sizes"):
        _quant_matmul.expert("Q4_K", gu, "Q6_K", np.ascontiguousarray(down[:, :100]), 256, 256, x, 2, y, "scalar", 1, 0)
    with pytest.raises(ValueError, match="buffer sizes"):
        _quant_matmul.expert("Q4_K", gu, "Q6_K", down, 256, 256, x, 3, y, "scalar", 1, 0)
    with pytest.raises(ValueError, match="buffer sizes"):
        _quant_matmul.expert("Q4_K", gu, "Q6_K", down, 256, 256, x, 2, y[:1], "scalar", 1, 0)
    with pytest.raises(ValueError, match="unknown format"):
        _quant_matmul.expert("Q4_K", gu, "Q5_K", down, 256, 256, x, 2, y, "scalar", 1, 0)
    with pytest.raises(ValueError, match="unsupported"):
        _quant_matmul.expert("Q4_K", gu, "Q6_K", down, 256, 256, x, 2, y, "neon", 1, 0)
    with pytest.raises(ValueError, match="bad shape"):
        _quant_matmul.expert("Q4_K", gu, "Q6_K", down, 256, 200, x, 2, y, "scalar", 1, 0)
    with pytest.raises(ValueError, match="bad shape"):
        _quant_matmul.expert("Q4_K", gu, "Q6_K", down, 256, 256, x, 2, y, "scalar", 0, 0)
    with pytest.raises(ValueError, match="bad shape"):
        _quant_matmul.expert("Q4_K", gu, "Q6_K", down, 256, 256, x, -1, y, "scalar", 1, 0)


# --- the C dequantizer (_quant_matmul.dequantize, the large-batch path's tiles) --------------------------


def c_dequantize(fmt: str, blocks: np.ndarray, n: int, r0: int, r1: int, variant: str,
                 threads: int = 1) -> np.ndarray:
    from core.experts import _quant_matmul

    out = np.empty((r1 - r0, n), dtype=np.float32)
    _quant_matmul.dequantize(fmt, blocks, blocks.shape[0], n, r0, r1, out, variant, threads)
    return out


def special_scales(fmt: str, blocks: np.ndarray) -> np.ndarray:
    """blocks with some f16 scales set to edge values: +-0, the smallest subnormal, a
    subnormal, the largest finite, 1.0 (bit patterns, little-endian)."""
    blocks = blocks.copy()
    size = GGMLType(fmt).type_size
    raw = blocks.reshape(blocks.shape[0], -1, size)
    specials = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x3C00], dtype=np.uint16)
    for off in F16_FIELDS[fmt]:
        flat = raw[:, :, off : off + 2].reshape(-1, 2)
        picks = np.arange(0, flat.shape[0], 5)
        flat[picks] = specials[picks % len(specials)].view(np.uint8).reshape(-1, 2)
        raw[:, :, off : off + 2] = flat.reshape(raw.shape[0], raw.shape[1], 2)
    return blocks


@needs_c
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_c_dequantize_bit_exact(fmt, variant):
    """Every variant against gguf's decoder, bit for bit: random valid blocks (every bit of every
    packed field), edge-value scales, odd row counts and offsets, an odd Q8_0 block count, one
    and two threads, empty ranges."""
    rng = np.random.default_rng(40)
    m, n = 37, (800 if fmt == "Q8_0" else 768)
    blocks = special_scales(fmt, random_blocks(rng, fmt, m, n))
    ref = reference_weights(fmt, blocks)
    for r0, r1 in ((0, m), (3, 36), (36, 37), (5, 5), (m, m)):
        for threads in (1, 2):
            out = c_dequantize(fmt, blocks, n, r0, r1, variant, threads)
            assert np.array_equal(out.view(np.uint32), ref[r0:r1].view(np.uint32)), (
                f"{fmt} {variant} rows {r0}..{r1}: " + bit_report(out, ref[r0:r1]))


@needs_c
@pytest.mark.parametrize("fmt", FORMATS)
def test_c_dequantize_on_the_pool(fmt):
    """A tile large enough to be split into many pool tasks (~64K values each), with a partial
    last task, matches the single-threaded result and gguf bit for bit; two Python threads
    dequantizing at once (one drives the pool, the other runs alone) agree with it too."""
    rng = np.random.default_rng(41)
    m, n = 301, 4096  # 16 rows per task: 19 tasks, the last of 13 rows
    blocks = random_blocks(rng, fmt, m, n)
    ref = reference_weights(fmt, blocks)
    assert np.array_equal(c_dequantize(fmt, blocks, n, 0, m, VARIANTS[0], threads=2), ref)
    assert np.array_equal(c_dequantize(fmt, blocks, n, 1, m, VARIANTS[0], threads=3), ref[1:])
    results: dict[int, list[np.ndarray]] = {}

    def work(i: int) -> None:
        results[i] = [c_dequantize(fmt, blocks, n, 0, m, VARIANTS[0], threads=2) for _ in range(5)]

    workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    assert all(np.array_equal(out, ref) for i in range(2) for out in results[i])


@needs_c
def test_c_dequantize_from_gguf_quantizer():
    """Real Q8_0 blocks from gguf-py's quantizer round-trip exactly as gguf decodes them."""
    rng = np.random.default_rng(42)
    blocks = quants.quantize(rng.standard_normal((9, 96)).astype(np.float32), GGMLQuantizationType.Q8_0)
    for variant in VARIANTS:
        assert np.array_equal(c_dequantize("Q8_0", blocks, 96, 0, 9, variant), reference_weights("Q8_0", blocks))


@needs_c
def test_c_dequantize_rejects_bad_arguments():
    from core.experts import _quant_matmul

    blocks = random_blocks(np.random.default_rng(43), "Q6_K", 4, 512)
    out = np.zeros((2, 512), np.float32)
    _quant_matmul.dequantize("Q6_K", blocks, 4, 512, 1, 3, out, "scalar", 1)  # the valid call
    for args, match in [
        (("Q6_K", blocks[:3], 4, 512, 1, 3, out), "buffer sizes"),  # w short
        (("Q6_K", blocks, 4, 512, 1, 3, out[:1]), "buffer sizes"),  # out short
        (("Q6_K", blocks, 4, 512, 0, 3, out), "buffer sizes"),  # out too long for 3 rows
        (("Q4_K", blocks, 4, 512, 1, 3, out), "buffer sizes"),  # another format's row size
        (("Q5_K", blocks, 4, 512, 1, 3, out), "unknown format"),
        (("Q6_K", blocks, 4, 500, 1, 3, out), "bad shape"),  # n not a multiple of 256
        (("Q6_K", blocks, 4, 0, 1, 3, out), "bad shape"),
        (("Q6_K", blocks, 4, 512, -1, 1, out), "bad shape"),
        (("Q6_K", blocks, 4, 512, 3, 1, out), "bad shape"),  # r1 < r0
        (("Q6_K", blocks, 4, 512, 3, 5, out), "bad shape"),  # r1 > m
        (("Q6_K", blocks, -4, 512, 0, 0, out[:0]), "bad shape"),
        (("Q6_K", blocks, 1 << 30, 1 << 30, 0, 2, out), "buffer sizes"),  # huge sizes
    ]:
        with pytest.raises(ValueError, match=match):
            _quant_matmul.dequantize(*args, "scalar", 1)
    with pytest.raises(ValueError, match="bad shape"):
        _quant_matmul.dequantize("Q6_K", blocks, 4, 512, 1, 3, out, "scalar", 0)
    with pytest.raises(ValueError, match="unsupported"):
        _quant_matmul.dequantize("Q6_K", blocks, 4, 512, 1, 3, out, "neon", 1)
    readonly = out.copy()
    readonly.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        _quant_matmul.dequantize("Q6_K", blocks, 4, 512, 1, 3, readonly, "scalar", 1)
    strided = np.zeros((2, 1024), np.float32)[:, ::2]  # the right size, not contiguous
    with pytest.raises((TypeError, BufferError, ValueError)):
        _quant_matmul.dequantize("Q6_K", blocks, 4, 512, 1, 3, strided, "scalar", 1)
