"""The C Q8_0 activation codec (core/quantization/_q8_rows.c) writes the numpy/numba path's bytes and floats.

A receipt binds the exact bytes of a request and an answer, so a router and a holder that encode the
same rows with different builds must still agree byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from core.quantization import activations
from core.quantization.activations import (
    decode_rows_q8_0,
    decode_rows_q8_0_numpy,
    encode_rows_q8_0,
    encode_rows_q8_0_numpy,
    row_bytes_q8_0,
)

pytestmark = pytest.mark.skipif(activations._q8_rows is None, reason="core.quantization._q8_rows was not built")


def _same_encoding(x: np.ndarray) -> bytes:
    got = encode_rows_q8_0(x)
    assert got == encode_rows_q8_0_numpy(x)
    tokens, d = x.shape
    decoded = decode_rows_q8_0(got, tokens, d)
    assert decoded.tobytes() == decode_rows_q8_0_numpy(got, tokens, d).tobytes()
    return got


@pytest.mark.parametrize("d", [1, 31, 32, 40, 100, 768, 2048, 2047, 2048 + 7, 7168])
@pytest.mark.parametrize("rows", [0, 1, 3, 16])
def test_random_rows_of_every_width_are_the_reference_bytes(rows, d):
    rng = np.random.default_rng(rows * 10_000 + d)
    x = (rng.standard_normal((rows, d)) * rng.choice([1e-3, 1.0, 40.0], size=(rows, 1))).astype(np.float32)
    assert len(_same_encoding(x)) == rows * row_bytes_q8_0(d)


def test_edge_values_are_the_reference_bytes():
    """Zero blocks, ties at .5 steps, -0.0, values whose scale is an f16 subnormal or underflows, the
    largest scale f16 holds, and f32 subnormals."""
    rows = np.zeros((8, 64), np.float32)
    rows[1, :32] = np.arange(32) - 15.5  # ties after scaling
    rows[1, 32:] = -0.0
    rows[2] = np.float32(127 * 2.0**-20) * np.linspace(-1, 1, 64, dtype=np.float32)  # f16-subnormal scales
    rows[3] = np.float32(1e-38) * np.arange(64, dtype=np.float32)  # 1 / d overflows in f32: quants 0
    rows[4] = np.float32(65504 * 127) * np.sign(np.arange(64) - 31.5).astype(np.float32)  # the largest finite scale
    rows[5] = np.float32(1e-45) * np.arange(64, dtype=np.float32)  # f32 subnormals
    rows[6, ::2] = 127.0
    rows[6, 1::2] = -127.0
    rows[7] = np.float32(3.0e-37) * np.arange(64, dtype=np.float32)  # d an f32 subnormal, 1 / d finite
    _same_encoding(rows)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 100)),
                  elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
def test_any_finite_rows_are_the_reference_bytes_or_the_same_refusal(x):
    try:
        want = encode_rows_q8_0_numpy(x)
    except ValueError as exc:
        with pytest.raises(ValueError, match="overflow the f16 scales") as got:
            encode_rows_q8_0(x)
        assert str(got.value) == str(exc)
        return
    assert encode_rows_q8_0(x) == want


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_is_refused_by_name(bad):
    x = np.ones((2, 40), np.float32)
    x[1, 39] = bad  # in the padded last block of the last row
    with pytest.raises(ValueError) as refused:
        encode_rows_q8_0(x)
    with pytest.raises(ValueError) as reference:
        encode_rows_q8_0_numpy(x)
    assert str(refused.value) == str(reference.value) == "cannot quantize to Q8_0: input has non-finite values"


def test_a_scale_past_f16_is_refused():
    with pytest.raises(ValueError, match="overflow the f16 scales"):
        encode_rows_q8_0(np.full((1, 32), 65520 * 127, np.float32))


@pytest.mark.parametrize("scale", [b"\x00\x7c", b"\x00\xfc", b"\x01\x7e"])  # +inf, -inf, NaN
def test_a_non_finite_scale_in_the_last_block_is_refused_on_decode(scale):
    blob = bytearray(encode_rows_q8_0(np.ones((2, 64), np.float32)))
    blob[-34:-32] = scale
    with pytest.raises(ValueError, match="non-finite block scales"):
        decode_rows_q8_0(bytes(blob), 2, 64)


def test_any_buffer_decodes_and_a_wrong_length_is_named():
    x = np.random.default_rng(1).standard_normal((3, 96)).astype(np.float32)
    blob = encode_rows_q8_0(x)
    want = decode_rows_q8_0(blob, 3, 96)
    assert np.array_equal(decode_rows_q8_0(memoryview(bytearray(blob)), 3, 96), want)
    with pytest.raises(ValueError, match="need 306 bytes, got 305"):
        decode_rows_q8_0(blob[:-1], 3, 96)
