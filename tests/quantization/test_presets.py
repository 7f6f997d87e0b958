from __future__ import annotations

import pytest

from core.quantization.presets import PROJECTIONS, resolve_quant
from core.quantization.types import GGMLType as T


@pytest.mark.parametrize(("quant", "want"), [
    ("q4_k_m", (T.Q4_K, T.Q4_K, T.Q6_K)),
    ("Q8_0", (T.Q8_0,) * 3),
    ("q4_k", (T.Q4_K,) * 3),
    ("q6_k", (T.Q6_K,) * 3),
    (None, (T.F32,) * 3),
    ("none", (T.F32,) * 3),
    ({"gate": "q4_k", "up": "q4_k", "down": "q6_k"}, (T.Q4_K, T.Q4_K, T.Q6_K)),
    ({"gate": "F16", "up": "bf16", "down": T.Q8_0}, (T.F16, T.BF16, T.Q8_0)),
])
def test_resolve(quant, want):
    assert resolve_quant(quant) == dict(zip(PROJECTIONS, want, strict=True))


@pytest.mark.parametrize(("quant", "match"), [
    ("q5_k_m", "'q5_k_m'"),
    ({"gate": "q4_k", "up": "q4_k"}, r"missing projection\(s\) \['down'\]"),
    ({"gate": "q4_k", "up": "q4_k", "down": "q3_k"}, r"quant\['down'\].*'q3_k'"),
    ({"gate": "q4_k", "up": "q4_k", "down": "q6_k", "o": "q8_0"}, r"unknown projection\(s\) \['o'\]"),
    (42, "42"),
])
def test_bad_values_named(quant, match):
    with pytest.raises(ValueError, match=match):
        resolve_quant(quant)
