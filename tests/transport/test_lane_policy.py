"""How many connection lanes a large request takes (core/transport/lanes.py): pure, no sockets."""

from core.transport.lanes import LanePolicy


def test_a_request_within_the_window_or_with_the_window_unknown_takes_one_lane() -> None:
    policy = LanePolicy(16)
    assert policy.wanted(60_000, window=64_000, rtt_s=0.03, now=0.0) == 1
    assert policy.wanted(10**7, window=None, rtt_s=None, now=0.0) == 1
    assert policy.wanted(10**7, window=30_000, rtt_s=None, now=0.0) == 1  # no RTT sample yet
    assert policy.wanted(10**7, window=0, rtt_s=0.03, now=0.0) == 1


def test_a_short_path_whose_round_trips_take_under_10_ms_keeps_one_lane() -> None:
    """On a LAN a window refills in well under a millisecond: a split would only add requests."""
    policy = LanePolicy(16)
    assert policy.wanted(1_000_000, window=30_000, rtt_s=0.0002, now=0.0) == 1  # 34 rounds x 0.2 ms
    assert policy.wanted(1_000_000, window=30_000, rtt_s=0.001, now=0.1) == 16  # 34 rounds x 1 ms


def test_a_request_larger_than_the_window_takes_a_lane_per_window_up_to_the_limit() -> None:
    policy = LanePolicy(16)
    assert policy.wanted(100_000, window=30_000, rtt_s=0.03, now=0.0) == 4  # ceil(100/30)
    assert policy.wanted(10**7, window=30_000, rtt_s=0.03, now=0.1) == 16
    assert LanePolicy(1).wanted(10**7, window=30_000, rtt_s=0.03, now=0.0) == 1  # TENZRO_QUIC_LANES=1: off
    assert policy.wanted(40_000, window=3_000, rtt_s=0.03, now=0.2) == 2  # a part is at least 16 KiB


def test_a_standing_queue_keeps_the_request_on_one_lane_and_its_draining_restores_the_lanes() -> None:
    """Congestion (the RTT well above the path's base) is not random loss: more connections would only
    take more of a shared bottleneck."""
    policy = LanePolicy(16)
    now = 0.0
    for _ in range(32):  # the path's base: 30 ms
        now += 0.05
        assert policy.wanted(500_000, window=30_000, rtt_s=0.030, now=now) == 16
    for _ in range(24):  # a queue builds: 30 ms more on every sample
        now += 0.05
        last = policy.wanted(500_000, window=30_000, rtt_s=0.060, now=now)
    assert last == 1
    for _ in range(32):  # it drains
        now += 0.05
        last = policy.wanted(500_000, window=30_000, rtt_s=0.031, now=now)
    assert last == 16


def test_reordered_samples_far_below_the_path_do_not_read_as_a_queue() -> None:
    policy = LanePolicy(8)
    now, wanted = 0.0, []
    for i in range(200):  # 30 ms with jitter, every 20th sample a reordered 2 ms one
        now += 0.05
        wanted.append(policy.wanted(500_000, window=40_000, rtt_s=0.002 if i % 20 == 0 else 0.030 + (i % 5) / 1000,
                                    now=now))
    assert set(wanted) == {8}


def test_after_a_pause_the_path_is_read_afresh_and_a_longer_route_is_no_queue() -> None:
    """Samples from before a pause are no base: a route that changed meanwhile would read as a queue."""
    policy = LanePolicy(16)
    now = 0.0
    for _ in range(40):  # a LAN: no lanes wanted there
        now += 0.05
        policy.wanted(500_000, window=30_000, rtt_s=0.0003, now=now)
    now += 6.0  # a pause, then 30 ms from now on
    wanted = []
    for _ in range(40):
        now += 0.05
        wanted.append(policy.wanted(500_000, window=30_000, rtt_s=0.030, now=now))
    assert set(wanted) == {16}
