from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from core.quantization.activations import decode_rows_q8_0, encode_rows_q8_0, row_bytes_q8_0


@pytest.mark.parametrize("d", [32, 768, 100, 1, 2048 + 7])
def test_round_trip(d):
    x = np.random.default_rng(d).standard_normal((5, d)).astype(np.float32) * 3
    blob = encode_rows_q8_0(x)
    assert len(blob) == 5 * row_bytes_q8_0(d)
    y = decode_rows_q8_0(blob, 5, d)
    assert y.shape == (5, d) and y.dtype == np.float32
    assert np.abs(y - x).max() <= np.abs(x).max() / 127 * 0.51 + 1e-7


def test_bytes_are_gguf_q8_0():
    x = np.random.default_rng(0).standard_normal((4, 768)).astype(np.float32)
    blob = encode_rows_q8_0(x)
    assert blob == gq.quantize(x, GGMLQuantizationType.Q8_0).tobytes()


def test_padding_does_not_change_real_values():
    x = np.random.default_rng(1).standard_normal((2, 40)).astype(np.float32)
    padded = np.pad(x, ((0, 0), (0, 24)))
    assert np.array_equal(decode_rows_q8_0(encode_rows_q8_0(x), 2, 40),
                          decode_rows_q8_0(encode_rows_q8_0(padded), 2, 64)[:, :40])


def test_zero_tokens():
    assert encode_rows_q8_0(np.zeros((0, 64), np.float32)) == b""
    assert decode_rows_q8_0(b"", 0, 64).shape == (0, 64)


def test_rejections():
    blob = encode_rows_q8_0(np.ones((2, 64), np.float32))
    with pytest.raises(ValueError, match="need 136 bytes, got 135"):
        decode_rows_q8_0(blob[:-1], 2, 64)
    bad = bytearray(blob)
    bad[0:2] = np.array([np.nan], "<f2").tobytes()
    with pytest.raises(ValueError, match="non-finite"):
        decode_rows_q8_0(bytes(bad), 2, 64)
    with pytest.raises(ValueError, match="non-finite"):
        encode_rows_q8_0(np.full((1, 32), np.inf, np.float32))
    with pytest.raises(ValueError, match="tokens, d"):
        encode_rows_q8_0(np.ones(32, np.float32))
