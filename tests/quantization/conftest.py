"""Shared inputs for the quantization kernel tests (seeded, adversarial cases included)."""

from __future__ import annotations

import numpy as np
import pytest

from core.quantization import kquant_c, numba_codecs


def adversarial_inputs(n: int, rows: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """Named f32 [rows, n] arrays: random and the edge cases every format must survive."""
    rng = np.random.default_rng(seed)
    gauss = rng.standard_normal((rows, n)).astype(np.float32)
    outlier = (rng.standard_normal((rows, n)) * 0.01).astype(np.float32)
    outlier[:, ::32] = 1000.0  # one huge value in every 32-block (and every sub-block)
    return {
        "gaussian": gauss,
        "student_t": rng.standard_t(3, (rows, n)).astype(np.float32),
        "zeros": np.zeros((rows, n), np.float32),
        "outlier": outlier,
        "negative": -np.abs(gauss) - np.float32(0.5),
        "positive": np.abs(gauss) + np.float32(0.5),
        "subnormal": (rng.standard_normal((rows, n)) * 1e-39).astype(np.float32),
        "tiny": (rng.standard_normal((rows, n)) * 1e-6).astype(np.float32),
        "constant": np.full((rows, n), -3.25, np.float32),
        "ties": (rng.integers(-50, 50, (rows, n)) * 0.5).astype(np.float32),
    }


@pytest.fixture(params=[True, False], ids=["jit", "numpy"])
def jit_mode(request):
    """Run a test on both the numba path and the pure numpy reference path."""
    before = numba_codecs.enabled()
    numba_codecs.set_enabled(request.param)
    yield request.param
    numba_codecs.set_enabled(before)


@pytest.fixture(params=["c", "numpy"], ids=["kquant_c", "kquant_numpy"])
def kquant_mode(request):
    """Run a test with the C Q4_K/Q6_K encoders (skipped when not built) and with numpy's."""
    if request.param == "c" and not kquant_c.available():
        pytest.skip("core.quantization._kquant_encoders not built")
    before = kquant_c.enabled()
    kquant_c.set_enabled(request.param == "c")
    yield request.param
    kquant_c.set_enabled(before)


def bit_diff_report(a: np.ndarray, b: np.ndarray) -> str:
    """'k of n elements differ, m bits' for two same-shape arrays."""
    ua = np.ascontiguousarray(a).view(np.uint8)
    ub = np.ascontiguousarray(b).view(np.uint8)
    bits = int(np.unpackbits(ua ^ ub).sum())
    elems = int(np.count_nonzero(np.ascontiguousarray(a).view(np.uint8).reshape(a.shape[0], -1)
                                 != np.ascontiguousarray(b).view(np.uint8).reshape(b.shape[0], -1)))
    return f"{elems} of {ua.size} bytes differ ({bits} bits)"
