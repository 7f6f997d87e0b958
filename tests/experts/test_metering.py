from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.experts.metering import DemandMeter, ThroughputMeter


def test_rows_per_second_of_compute_over_the_window():
    meter = ThroughputMeter()
    assert meter.rows_per_second(now=0.0) == 0.0
    meter.record(100, 0.5, now=10.2)
    meter.record(300, 0.5, now=10.7)  # same bucket
    meter.record(200, 1.0, now=30.0)
    assert meter.rows_per_second(now=31.0) == pytest.approx(600 / 2.0)
    # the 10 s bucket leaves the window at 71 s; 30 s stays
    assert meter.rows_per_second(now=71.5) == pytest.approx(200 / 1.0)


def test_idle_window_holds_the_last_measurement():
    meter = ThroughputMeter()
    meter.record(50, 0.1, now=5.0)
    meter.record(50, 0.1, now=6.0)
    assert meter.rows_per_second(now=500.0) == pytest.approx(500.0)
    meter.record(10, 1.0, now=600.0)
    assert meter.rows_per_second(now=600.5) == pytest.approx(10.0)


def test_demand_is_rows_per_wall_second_over_the_window_per_expert():
    meter = DemandMeter()
    assert meter.rates(now=0.0) == {}
    meter.record("a", 600, now=10.2)
    meter.record("a", 600, now=10.7)  # same bucket
    meter.record("b", 60, now=30.0)
    # wall time, not compute time: 1,200 rows in the minute are 20 rows/s however fast they ran
    assert meter.rates(now=31.0) == pytest.approx({"a": 20.0, "b": 1.0})
    # the 10 s bucket leaves the window at 71 s; an expert with nothing left in it is gone
    assert meter.rates(now=71.5) == pytest.approx({"b": 1.0})
    assert meter.rates(now=200.0) == {}


@given(events=st.lists(st.tuples(st.sampled_from("xyz"), st.integers(0, 1000), st.floats(0, 300)), max_size=60),
       now=st.floats(0, 400))
def test_demand_counts_exactly_the_rows_of_the_window(events, now):
    """Property: an expert's rate is the rows of whole seconds inside the window, divided by the window."""
    meter = DemandMeter(window_s=60.0)
    for key, rows, at in sorted(events, key=lambda e: e[2]):
        meter.record(key, rows, now=at)
    expected: dict[str, float] = {}
    for key, rows, at in events:
        if int(at) + 1.0 > now - 60.0:
            expected[key] = expected.get(key, 0.0) + rows / 60.0
    assert meter.rates(now=now) == pytest.approx(expected)
