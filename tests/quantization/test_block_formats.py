"""Every block format: GGUF-exact decode, round-trip error, fallback, properties, quality.

Parametrized over the kernel registry; every RNG is seeded.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from core.quantization.baseline import NAIVE
from core.quantization.registry import KERNELS, dequantize, quantize
from core.quantization.types import GGMLType, resolve_type, row_bytes

from .conftest import adversarial_inputs, bit_diff_report

BLOCK_TYPES = sorted(KERNELS, key=lambda t: t.value)
ALL_TYPES = list(GGMLType)
GGUF = {t: GGMLQuantizationType[t.value] for t in GGMLType}
# Worst-case |error| relative to the block's max |x| (generous; K-quants lose a bit to the
# 6/8-bit sub-block scales).
# MXFP4: a value is at most 2d (1/4 of the block's top binade) from its code, a clipped one
# (gguf's scale tops out at 1.5·2^floor(log2 amax)) less than amax/4.
REL_BOUND = {GGMLType.Q8_0: 0.5 / 127 + 1e-3, GGMLType.Q4_K: 0.12, GGMLType.Q6_K: 0.04, GGMLType.MXFP4: 0.25,
             GGMLType.F32: 0.0, GGMLType.F16: 2**-11, GGMLType.BF16: 2**-8}
RMSE_BOUND = {GGMLType.Q8_0: 0.006, GGMLType.Q4_K: 0.08, GGMLType.Q6_K: 0.02, GGMLType.MXFP4: 0.12}


def test_registry_holds_every_block_type():
    assert set(KERNELS) == {GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.MXFP4}
    for t, k in KERNELS.items():
        assert (k.block_size, k.type_size) == gq.GGML_QUANT_SIZES[GGUF[t]]


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.value)
@pytest.mark.parametrize("case", sorted(adversarial_inputs(256)))
def test_decode_matches_gguf_bit_for_bit(ggml_type, case, jit_mode, kquant_mode):
    x = adversarial_inputs(512, seed=3)[case]
    blob = quantize(x, ggml_type)
    assert blob.dtype == np.uint8 and blob.shape == (x.shape[0], row_bytes(ggml_type, 512))
    ours = dequantize(blob, ggml_type, x.shape)
    ref = gq.dequantize(blob, GGUF[ggml_type])
    assert ours.dtype == np.float32 and ours.shape == x.shape
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), bit_diff_report(ours, ref)


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.value)
def test_decode_random_bytes_matches_gguf(ggml_type, jit_mode):
    """Arbitrary block bytes (finite scales) decode identically: covers every packed bit."""
    k = KERNELS[ggml_type]
    raw = np.random.default_rng(11).integers(0, 256, (64, k.type_size), dtype=np.uint8)
    for field in {GGMLType.Q8_0: [0], GGMLType.Q4_K: [0, 2], GGMLType.Q6_K: [208], GGMLType.MXFP4: []}[ggml_type]:
        raw[:, field + 1] &= 0x3B  # keep the f16 exponent below inf/NaN
    if ggml_type == GGMLType.MXFP4:
        raw[:, 0] = np.minimum(raw[:, 0], 252)  # E8M0 exponents whose blocks stay finite
    ours = dequantize(raw, ggml_type, (64, k.block_size))
    ref = gq.dequantize(raw, GGUF[ggml_type])
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), bit_diff_report(ours, ref)


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.value)
def test_jit_and_numpy_paths_agree(ggml_type):
    from core.quantization import numba_codecs

    x = adversarial_inputs(1024, seed=7)["student_t"]
    before = numba_codecs.enabled()
    try:
        numba_codecs.set_enabled(False)
        blob_np = quantize(x, ggml_type)
        y_np = dequantize(blob_np, ggml_type, x.shape)
        numba_codecs.set_enabled(True)
        blob_jit = quantize(x, ggml_type)
        y_jit = dequantize(blob_np, ggml_type, x.shape)
    finally:
        numba_codecs.set_enabled(before)
    assert np.array_equal(blob_np, blob_jit), bit_diff_report(blob_np, blob_jit)
    assert np.array_equal(y_np.view(np.uint32), y_jit.view(np.uint32)), bit_diff_report(y_np, y_jit)


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: t.value)
@pytest.mark.parametrize("case", sorted(adversarial_inputs(256)))
def test_round_trip_error_bounded(ggml_type, case, kquant_mode):
    x = adversarial_inputs(768, seed=1)[case]
    y = dequantize(quantize(x, ggml_type), ggml_type, x.shape)
    assert np.isfinite(y).all()
    block = max(ggml_type.block_size, 16)
    xb, yb = x.reshape(-1, block), y.reshape(-1, block)
    scale = np.abs(xb).max(axis=1, keepdims=True)
    # f16 scales cannot represent steps below 2**-24 (~6e-8, times up to 127 levels): allow
    # that absolute slack, which only matters for the "tiny" and "subnormal" cases.
    err = np.abs(yb - xb) - (REL_BOUND[ggml_type] * scale + 1e-5 * (ggml_type.is_block))
    if ggml_type in (GGMLType.F16, GGMLType.BF16) and case in ("subnormal", "tiny"):
        err = np.abs(yb - xb) - 1e-5  # below the f16 normal range the bound is absolute
    bad = int(np.count_nonzero(err > 0))
    assert bad == 0, f"{bad} of {x.size} elements exceed the {ggml_type.value} error bound ({case})"
    if case == "zeros":
        assert not y.any()


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.value)
def test_gaussian_rmse(ggml_type, kquant_mode):
    x = np.random.default_rng(2).standard_normal((64, 2048)).astype(np.float32)
    y = dequantize(quantize(x, ggml_type), ggml_type, x.shape)
    rel = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))
    assert rel < RMSE_BOUND[ggml_type]


@pytest.mark.parametrize("ggml_type", sorted(NAIVE, key=lambda t: t.value), ids=lambda t: t.value)
@pytest.mark.parametrize("dist", ["gaussian", "student_t"])
def test_searched_scales_beat_naive_min_max(ggml_type, dist, kquant_mode):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((32, 4096)) if dist == "gaussian" else rng.standard_t(3, (32, 4096))).astype(np.float32)

    def rmse(blob):
        return float(np.sqrt(np.mean((dequantize(blob, ggml_type, x.shape) - x) ** 2)))

    ours, naive = rmse(quantize(x, ggml_type)), rmse(NAIVE[ggml_type](x))
    assert ours < 0.97 * naive, (ours, naive)


@pytest.mark.parametrize(("requested", "n", "used"), [
    (GGMLType.Q4_K, 512, GGMLType.Q4_K),
    (GGMLType.Q4_K, 96, GGMLType.Q8_0),
    (GGMLType.Q6_K, 1408, GGMLType.Q8_0),  # 1408 = 5.5 * 256
    (GGMLType.Q6_K, 100, GGMLType.F16),
    (GGMLType.Q8_0, 100, GGMLType.F16),
    (GGMLType.Q8_0, 64, GGMLType.Q8_0),
    (GGMLType.BF16, 7, GGMLType.BF16),
])
def test_fallback_rule(requested, n, used):
    assert resolve_type(requested, n) is used
    x = np.random.default_rng(n).standard_normal((3, n)).astype(np.float32)
    y = dequantize(quantize(x, used), used, x.shape)
    assert np.abs(y - x).max() < 0.25 * np.abs(x).max()


def test_unfallen_row_length_rejected():
    with pytest.raises(ValueError, match="not a multiple"):
        quantize(np.zeros((2, 100), np.float32), GGMLType.Q4_K)
    with pytest.raises(ValueError, match="unknown ggml_type"):
        quantize(np.zeros((2, 256), np.float32), "Q5_K")


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.value)
def test_bits_per_weight(ggml_type):
    nominal = {GGMLType.Q8_0: 8.5, GGMLType.Q4_K: 4.5, GGMLType.Q6_K: 6.5625, GGMLType.MXFP4: 4.25}[ggml_type]
    assert ggml_type.bits_per_weight == nominal
    assert row_bytes(ggml_type, 2048) * 8 / 2048 == nominal


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    ggml_type=st.sampled_from(BLOCK_TYPES),
    rows=st.integers(1, 3),
    blocks=st.integers(1, 2),
    data=st.data(),
)
def test_property_decode_is_gguf_and_bounded(ggml_type, rows, blocks, data):
    n = blocks * ggml_type.block_size
    x = data.draw(hnp.arrays(np.float32, (rows, n), elements=st.floats(
        -1e4, 1e4, allow_nan=False, allow_infinity=False, allow_subnormal=True, width=32)))
    blob = quantize(x, ggml_type)
    y = dequantize(blob, ggml_type, x.shape)
    ref = gq.dequantize(blob, GGUF[ggml_type])
    assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), bit_diff_report(y, ref)
    bound = np.abs(x).reshape(-1, 16).max(axis=1, keepdims=True) * REL_BOUND[ggml_type] + 1e-6
    if ggml_type in (GGMLType.Q8_0, GGMLType.MXFP4):
        bound = np.abs(x).reshape(-1, 32).max(axis=1, keepdims=True) * REL_BOUND[ggml_type] + 1e-6
        assert (np.abs(y - x).reshape(-1, 32) <= bound).all()
    else:
        # K-quants share a super-block scale: bound by the super-block's max.
        bound = np.abs(x).reshape(-1, 256).max(axis=1, keepdims=True) * REL_BOUND[ggml_type] + 1e-6
        assert (np.abs(y - x).reshape(-1, 256) <= bound).all()


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.sampled_from(BLOCK_TYPES), st.integers(0, 2**32 - 1))
def test_property_requantize_is_stable(ggml_type, seed):
    # (runs with the default encoder: C when built; test_kquant_encoders covers the C path directly)
    """Quantizing a decoded tensor again must not drift far (idempotence up to rounding)."""
    x = np.random.default_rng(seed).standard_normal((2, 256)).astype(np.float32)
    y1 = dequantize(quantize(x, ggml_type), ggml_type, x.shape)
    y2 = dequantize(quantize(y1, ggml_type), ggml_type, x.shape)
    assert np.sqrt(np.mean((y2 - y1) ** 2)) <= np.sqrt(np.mean((y1 - x) ** 2)) + 1e-6
