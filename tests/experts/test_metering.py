from __future__ import annotations

import pytest

from core.experts.metering import ThroughputMeter


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
