"""Q8_0 must be bit-identical to gguf-py's reference quantizer (= llama.cpp's)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from core.quantization.registry import dequantize, quantize
from core.quantization.types import GGMLType

from .conftest import adversarial_inputs, bit_diff_report


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf-py itself warns on subnormals
@pytest.mark.parametrize("n", [32, 96, 2048])
@pytest.mark.parametrize("case", sorted(adversarial_inputs(32)))
def test_bytes_equal_gguf_quantize(case, n, jit_mode):
    x = adversarial_inputs(n, seed=n)[case]
    ours = quantize(x, GGMLType.Q8_0)
    ref = gq.quantize(x, GGMLQuantizationType.Q8_0)
    assert ours.shape == ref.shape == (x.shape[0], n // 32 * 34)
    if case == "subnormal":
        # 1/d overflows: llama.cpp casts inf to int8 (undefined); we store 0.  d is 0 in
        # f16 for both, so both decode to exactly zero.
        assert np.array_equal(ours[:, :2], ref[:, :2])
        assert not dequantize(ours, GGMLType.Q8_0, x.shape).any()
        assert not gq.dequantize(ref, GGMLQuantizationType.Q8_0).any()
        return
    assert np.array_equal(ours, ref), bit_diff_report(ours, ref)


def test_round_half_away_from_zero_ties():
    # amax 127 -> d = 1, so x * (1/d) hits exact .5 ties: C roundf rounds them away from zero.
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 127
    x[0, 1:8] = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5]
    q = quantize(x, GGMLType.Q8_0)[0, 2:].view(np.int8)
    assert list(q[:8]) == [127, 1, -1, 2, -2, 3, -3, 127]


def test_scale_is_amax_over_127():
    x = np.linspace(-3, 2, 32, dtype=np.float32)[None]
    d = quantize(x, GGMLType.Q8_0)[0, :2].view("<f2")[0]
    assert d == np.float16(np.float32(3) / np.float32(127))


def test_overflowing_scale_rejected():
    x = np.full((1, 32), 1e7, np.float32)  # amax/127 > f16 max
    with pytest.raises(ValueError, match="overflow"):
        quantize(x, GGMLType.Q8_0)


def test_non_finite_input_rejected():
    x = np.zeros((1, 32), np.float32)
    x[0, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        quantize(x, GGMLType.Q8_0)


def test_dequantize_accepts_flat_bytes(jit_mode):
    x = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)
    blob = quantize(x, GGMLType.Q8_0).tobytes()
    y = dequantize(np.frombuffer(blob, np.uint8), GGMLType.Q8_0, (3, 64))
    assert np.abs(y - x).max() <= np.abs(x).max() / 127
