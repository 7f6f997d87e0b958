"""The tolerant controller's sans-I/O signals: spurious losses raise the thresholds; loss is congestion
only with a queue, or heavy."""

import pytest

from core.transport.loss_signals import MIN_PACKET_THRESHOLD, TIME_THRESHOLD, CongestionSignal, ReorderingTolerance

DATAGRAM = 1_350


def test_a_packet_declared_lost_by_count_and_then_acknowledged_raises_the_packet_threshold() -> None:
    tolerance = ReorderingTolerance()
    tolerance.declared_lost(10, largest_acked=40, size=DATAGRAM, by_time=False)
    tolerance.declared_lost(11, largest_acked=40, size=DATAGRAM, by_time=False)
    assert tolerance.acknowledged([range(0, 5), range(20, 41)]) == 0  # neither is in these ranges
    assert tolerance.packet_threshold == MIN_PACKET_THRESHOLD
    assert tolerance.acknowledged([range(10, 12)]) == 2 * DATAGRAM
    assert tolerance.packet_threshold == 31  # 40 - 10 + 1: the reordering that packet 10 showed
    assert tolerance.spurious == 2
    assert tolerance.acknowledged([range(10, 12)]) == 0  # counted once
    assert tolerance.time_factor == TIME_THRESHOLD


def test_time_declared_spurious_losses_widen_the_time_threshold_by_steps_up_to_its_ceiling() -> None:
    tolerance = ReorderingTolerance()
    for step in range(20):
        tolerance.declared_lost(step, largest_acked=step + 1, size=DATAGRAM, by_time=True)
        tolerance.acknowledged([range(step, step + 1)])
    assert tolerance.time_factor == tolerance.max_time_factor
    assert tolerance.packet_threshold == MIN_PACKET_THRESHOLD  # the count did not declare them


def test_the_packet_threshold_is_capped_and_old_declarations_are_forgotten() -> None:
    tolerance = ReorderingTolerance(max_packet_threshold=50, remembered=3)
    for number in range(5):
        tolerance.declared_lost(number, largest_acked=10_000, size=DATAGRAM, by_time=False)
    assert tolerance.acknowledged([range(0, 2)]) == 0  # 0 and 1 fell out of memory
    assert tolerance.acknowledged([range(2, 5)]) == 3 * DATAGRAM
    assert tolerance.packet_threshold == 50


def _samples(signal: CongestionSignal, rtt_s: float, count: int = 32, *, start: float = 0.0) -> None:
    for i in range(count):
        signal.rtt_sample(rtt_s, start + i * rtt_s)


def test_random_loss_on_an_idle_path_is_not_congestion() -> None:
    signal = CongestionSignal()
    _samples(signal, 0.030)
    for i in range(1000):
        (signal.lost if i % 100 == 0 else signal.acked)(DATAGRAM)
    assert signal.loss_rate == pytest.approx(0.01, abs=0.01)
    assert not signal.is_congestion(1.0)


def test_a_standing_queue_makes_loss_congestion_and_short_or_late_samples_do_not() -> None:
    signal = CongestionSignal()
    assert signal.queue_delay_s == 0.0  # no samples yet
    _samples(signal, 0.030)
    for i in range(64):  # every 10th sample early (reordered), every 7th late (a busy peer)
        signal.rtt_sample(0.015 if i % 10 == 0 else 0.080 if i % 7 == 0 else 0.030, 1.0 + i * 0.03)
    assert signal.base_rtt_s == pytest.approx(0.030) and not signal.queue_building()
    _samples(signal, 0.040, start=3.0)  # 10 ms above the base: under half the base RTT
    assert not signal.queue_building()
    _samples(signal, 0.050, start=4.5)
    assert signal.queue_delay_s == pytest.approx(0.020)
    assert signal.queue_building() and signal.is_congestion(6.0)  # at once: no RTT to wait


def test_a_path_whose_delay_grew_is_a_new_base_within_the_base_window() -> None:
    signal = CongestionSignal(base_window_s=10.0)
    _samples(signal, 0.001, count=64)  # a path through no delay
    _samples(signal, 0.030, count=32, start=5.0)  # the same connection, now 30 ms away
    assert signal.queue_building()  # within the window: it may be a queue
    _samples(signal, 0.030, count=32, start=16.0)
    assert signal.base_rtt_s == pytest.approx(0.030) and not signal.queue_building()


def test_heavy_loss_is_congestion_once_enough_was_seen_and_it_lasted_an_rtt() -> None:
    signal = CongestionSignal()
    _samples(signal, 0.030)
    signal.lost(DATAGRAM)
    for _ in range(5):
        signal.acked(DATAGRAM)
    assert signal.loss_rate > signal.heavy_loss
    assert not signal.is_congestion(1.0)  # one loss in six datagrams is chance, not a rate
    for i in range(200):
        (signal.lost if i % 10 == 0 else signal.acked)(DATAGRAM)
    assert not signal.is_congestion(2.0) and signal.heavy_pending  # seen, not yet an RTT old
    assert not signal.is_congestion(2.02)
    assert signal.is_congestion(2.031)
    signal.reduced()
    assert not signal.is_congestion(2.05)  # another RTT of it before the next reduction


def test_losses_found_spurious_are_taken_back() -> None:
    signal = CongestionSignal()
    for _ in range(150):
        signal.acked(DATAGRAM)
    for _ in range(30):
        signal.lost(DATAGRAM)
    assert signal.loss_heavy()
    signal.not_lost(30 * DATAGRAM)
    assert signal.loss_rate == 0.0 and not signal.is_congestion(1.0)
