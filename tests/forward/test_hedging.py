"""Hedge delays follow each holder's own p95 for batches of similar size."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from apps.forward.hedging import HedgePolicy, LatencyBook, linear_quantile, size_bucket


def test_buckets_are_powers_of_two():
    assert [size_bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 512)] == [0, 1, 2, 2, 3, 3, 4, 10]


def test_the_delay_is_the_holders_own_p95_at_that_size_else_the_default_else_none():
    book = LatencyBook(HedgePolicy(min_samples=4, floor_s=0.001, default_s=0.5))
    assert book.hedge_after_s("a", 64) == 0.5
    for ms in (10, 11, 12, 13, 100):
        book.record("a", 64, ms / 1000)
    assert 0.05 < book.hedge_after_s("a", 64) < 0.1  # p95 of a's 64-row batches
    assert book.hedge_after_s("a", 200) == 0.5  # another size (128-255 rows): no samples yet
    assert book.hedge_after_s("b", 100) == 0.5  # b unmeasured: never hedged on another holder's p95
    for _ in range(8):
        book.record("b", 64, 0.0001)
    assert book.hedge_after_s("b", 64) == 0.001  # the floor
    assert book.median_s("a") == 0.012 and book.median_s("nobody") is None
    unmeasured = LatencyBook(HedgePolicy(min_samples=4))  # no default: never hedged before measured
    assert unmeasured.hedge_after_s("a", 64) is None


@given(st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=1, max_size=80),
       st.floats(min_value=0.0, max_value=1.0))
def test_the_quantile_is_numpys_bit_for_bit(samples, q):
    ascending = sorted(samples)
    assert linear_quantile(ascending, q) == float(np.quantile(ascending, q))
