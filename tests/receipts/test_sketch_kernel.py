"""Every kernel of the Q8_0 receipt sketch writes the reference's bytes: the C extension's variants
(apps/receipts/_q8_sketch.c) and the numba kernel, on encoder output and on hostile bytes.

Pure: no Django, no services."""

from __future__ import annotations

import numpy as np
import pytest

from apps.receipts import topk_kernel
from apps.receipts.commitment import answer_sketch, sketch_bytes
from core.formats.wire import encode_rows
from core.quantization.f16 import F16_TO_F32

BUILT = topk_kernel._q8_sketch.variants() if topk_kernel._q8_sketch is not None else []
VARIANTS = [*BUILT, "numba"]


def reference(raw: np.ndarray, d: int, k: int) -> bytes:
    """raw uint8 [tokens, blocks * 34] -> the sketch of the rows the decoder computes from it."""
    tokens, blocks = raw.shape[0], raw.shape[1] // 34
    scales = F16_TO_F32[raw[:, 0::34].astype(np.int64) | (raw[:, 1::34].astype(np.int64) << 8)]
    with np.errstate(invalid="ignore", over="ignore"):
        values = scales[:, :, None] * raw.reshape(tokens, blocks, 34)[:, :, 2:].view(np.int8).astype(np.float32)
    return sketch_bytes(values.reshape(tokens, blocks * 32)[:, :d], k)


def sketched(raw: np.ndarray, d: int, k: int, variant: str) -> bytes:
    return topk_kernel.sketch_q8_0(raw.tobytes(), tokens=raw.shape[0], d_model=d, k=k, variant=variant).tobytes()


def test_the_best_variant_is_named() -> None:
    assert topk_kernel.sketch_variant() == (BUILT[0] if BUILT else "numba")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("d, k", [(2048, 16), (2048, 1), (2048, 64), (1000, 16), (256, 8), (100, 16), (64, 64)])
def test_encoded_rows_give_the_reference_sketch(variant: str, d: int, k: int) -> None:
    rng = np.random.default_rng(d * 31 + k)
    rows = np.concatenate([rng.standard_normal((6, d)), rng.standard_t(3, (6, d)),
                           np.round(rng.standard_normal((4, d)) * 2)])  # heavy tails; few distinct values: ties
    raw = np.frombuffer(encode_rows(rows.astype(np.float32), "q8_0"), dtype=np.uint8).reshape(len(rows), -1)
    assert sketched(raw, d, k, variant) == reference(raw, d, k)


@pytest.mark.parametrize("variant", VARIANTS)
def test_hostile_bytes_give_the_reference_sketch(variant: str) -> None:
    """Any bytes a holder may send: int8 -128, equal scales, zero, negative and subnormal scales, inf and
    NaN scales (the rows the router would refuse, sketched all the same), nonzero padding after a short
    last block, rows of one value (more candidates than the counted path takes)."""
    rng = np.random.default_rng(11)
    for trial in range(300):
        tokens, blocks = 4, int(rng.integers(1, 97))
        d = blocks * 32 - int(rng.integers(0, 32))
        raw = rng.integers(0, 256, (tokens, blocks * 34), dtype=np.uint8)
        raw[:, 0::34] = rng.integers(0, 4, raw[:, 0::34].shape)  # low scale bits: many equal scales
        raw[:, 1::34] = rng.choice([0x3C, 0xBC, 0x80, 0x00, 0x04, 0x40], raw[:, 1::34].shape)
        if trial % 2:
            raw[:, 2:] = rng.choice([0, 1, 2, 127, 128, 255], raw[:, 2:].shape)  # ties and -128
        if trial % 5 == 0:
            raw[0, 1 + 34 * int(rng.integers(blocks))] = rng.choice([0x7C, 0xFC, 0x7E])  # inf, -inf, NaN scale
        if trial % 7 == 0:
            raw[1, :] = 0
            raw[1, 1::34] = 0x3C
            raw[1, 2::34] = 5  # the row's first value of every block: 5.0, the rest 0
            raw[2].reshape(blocks, 34)[:, 2:] = 3  # one value everywhere: every value a candidate
            raw[2, 0::34], raw[2, 1::34] = 0, 0x3C
        k = int(rng.integers(1, min(d, 40) + 1))
        want = reference(raw, d, k)
        assert sketched(raw, d, k, variant) == want, (trial, blocks, d, k)
        if variant == VARIANTS[0]:  # the receipts' own path (apps.receipts.commitment) takes the best kernel
            assert answer_sketch(raw.tobytes(), "q8_0", tokens=tokens, d_model=d, k=k) == want


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_rows_and_wrong_sizes(variant: str) -> None:
    assert topk_kernel.sketch_q8_0(b"", tokens=0, d_model=64, k=4, variant=variant).shape == (0, 8)
    with pytest.raises(ValueError, match="need 136 bytes, got 135"):
        topk_kernel.sketch_q8_0(bytes(135), tokens=2, d_model=64, k=4, variant=variant)


@pytest.mark.skipif(not BUILT, reason="the C extension was not built (no compiler at install)")
def test_the_extension_refuses_what_it_cannot_do() -> None:
    sketch, out = topk_kernel._q8_sketch.sketch_q8_0, np.empty((1, 8), dtype=np.uint32)
    with pytest.raises(ValueError, match="no sketch variant avx512"):
        sketch([bytes(68)], 64, 4, F16_TO_F32, out, "avx512")
    with pytest.raises(ValueError, match="1 <= k <= d_model"):
        sketch([bytes(68)], 64, 65, F16_TO_F32, np.empty((1, 130), np.uint32))
    with pytest.raises(ValueError, match=r"out must be uint32 \[2, 8\]"):
        sketch([bytes(68), bytes(68)], 64, 4, F16_TO_F32, out)
    with pytest.raises(ValueError, match="part 1 has 67 bytes, not whole Q8_0 rows of 68"):
        sketch([bytes(68), bytes(67)], 64, 4, F16_TO_F32, out)
    with pytest.raises(ValueError, match="f16 table"):
        sketch([bytes(68)], 64, 4, F16_TO_F32[:10], out)
    with pytest.raises(TypeError):
        sketch([bytes(68), None], 64, 4, F16_TO_F32, np.empty((2, 8), np.uint32))


@pytest.mark.parametrize("variant", VARIANTS)
def test_answers_sketched_together_equal_each_alone_and_say_which_rows_are_finite(variant: str) -> None:
    rng = np.random.default_rng(5)
    answers = [np.frombuffer(encode_rows(rng.standard_normal((n, 256)).astype(np.float32), "q8_0"), np.uint8)
               .reshape(n, 272).copy() for n in (3, 0, 1, 8)]  # 8 blocks of 34 bytes a row
    answers[3][5, 1] = 0x7C  # +inf scale: its rows are not all finite
    together, finite = topk_kernel.sketch_q8_0_parts([a.tobytes() for a in answers], d_model=256, k=16,
                                                     variant=variant)
    assert together.tobytes() == b"".join(sketched(a, 256, 16, variant) for a in answers)
    assert finite == ((None,) * 4 if variant == "numba" else (True, True, True, False))
