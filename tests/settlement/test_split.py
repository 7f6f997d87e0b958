"""The pure split: exact sums, 12-place rounding, the burn takes the remainder."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.settlement.split import MAX_AMOUNT, QUANTUM, split_amounts

D = Decimal


def test_the_genesis_split():
    assert split_amounts(D("0.000002"), 90, D("0.9"), D("0.05")) == (
        D("0.000180000000"), D("0.000162000000"), D("0.000009000000"), D("0.000009000000"))


def test_rounding_goes_down_on_the_shares_and_the_burn_takes_the_rest():
    # gross 1e-12 × 7 = 7e-12: holder 6.3e-12 → 6e-12, router 0.35e-12 → 0, burn 1e-12.
    assert split_amounts(D("0.000000000001"), 7, D("0.9"), D("0.05")) == (D("7E-12"), D("6E-12"), D(0), D("1E-12"))
    # Shares summing to exactly 1: two half-ups would overshoot; rounding down leaves the burn ≥ 0.
    gross, holder, router, burn = split_amounts(D("0.000000000001"), 1, D("0.5"), D("0.5"))
    assert (gross, holder, router, burn) == (D("1E-12"), D(0), D(0), D("1E-12"))


def test_a_price_finer_than_the_quantum_rounds_the_gross_half_even():
    assert split_amounts(D("0.0000000000005"), 1, D(1), D(0))[0] == D(0)  # 0.5e-12 → 0 (even)
    assert split_amounts(D("0.0000000000015"), 1, D(1), D(0))[0] == D("2E-12")  # 1.5e-12 → 2e-12


@given(price=st.decimals(min_value=0, max_value=1000, places=15, allow_nan=False, allow_infinity=False),
       tokens=st.integers(0, 10**9),
       shares=st.tuples(st.integers(0, 1000), st.integers(0, 1000)).filter(lambda s: s[0] + s[1] <= 1000))
def test_parts_are_quantized_non_negative_and_sum_to_the_gross_exactly(price, tokens, shares):
    holder_share, router_share = D(shares[0]) / 1000, D(shares[1]) / 1000
    gross, holder, router, burn = split_amounts(price, tokens, holder_share, router_share)
    assert holder + router + burn == gross
    assert all(part >= 0 and part == part.quantize(QUANTUM) for part in (gross, holder, router, burn))
    assert abs(gross - price * tokens) <= QUANTUM / 2
    assert gross * holder_share - QUANTUM < holder <= gross * holder_share


@pytest.mark.parametrize(("args", "field"), [
    ((D(-1), 1, D("0.9"), D("0.05")), "price"),
    ((D("NaN"), 1, D("0.9"), D("0.05")), "price"),
    ((0.1, 1, D("0.9"), D("0.05")), "price"),
    ((D(1), -1, D("0.9"), D("0.05")), "tokens"),
    ((D(1), True, D("0.9"), D("0.05")), "tokens"),
    ((D(1), 1, D("1.1"), D(0)), "holder_share"),
    ((D(1), 1, D("0.9"), D("-0.1")), "router_share"),
    ((D(1), 1, D("0.9"), D("0.2")), "holder_share \\+ router_share"),
    ((MAX_AMOUNT, 1, D("0.9"), D("0.05")), "range"),
])
def test_bad_input_names_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        split_amounts(*args)
