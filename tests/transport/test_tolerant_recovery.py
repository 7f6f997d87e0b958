"""The "tolerant" controller over a simulated path (testkit/quic_sim.py, virtual time): fast under random
loss and reordering, and still backing off when a queue fills."""

import pytest

from core.transport.loss_signals import CongestionSignal
from testkit.quic_sim import Path, transfer

RTT = 0.030
SIZE = 2 << 20
CLEAN = Path(delay_s=RTT / 2)


@pytest.fixture(scope="module")
def clean_seconds(tmp_path_factory) -> float:
    return transfer(tmp_path_factory.mktemp("clean"), size=SIZE, up=CLEAN).seconds


def _target(clean_seconds: float) -> float:
    return 2 * clean_seconds + 2 * RTT  # the loss-recovery target of docs/performance.md


def test_one_percent_random_loss_costs_little_where_new_reno_crawls(tmp_path, clean_seconds) -> None:
    lossy = Path(delay_s=RTT / 2, loss=0.01)
    tolerant = transfer(tmp_path / "t", size=SIZE, up=lossy, seed=1)
    reno = transfer(tmp_path / "r", size=SIZE, up=lossy, seed=1, congestion="reno")
    assert tolerant.links["server"].random_drops > 0
    assert tolerant.seconds <= _target(clean_seconds), (tolerant.seconds, clean_seconds)
    assert tolerant.controller.tolerated > 0
    assert reno.seconds > 2 * tolerant.seconds  # what the library's own controller does on the same path


def test_reordering_is_learned_not_taken_for_loss(tmp_path, clean_seconds) -> None:
    reordering = Path(delay_s=RTT / 2, reorder=0.01)
    result = transfer(tmp_path, size=SIZE, up=reordering, seed=2)
    tolerance = result.sender.reordering
    assert tolerance.spurious > 0 and tolerance.packet_threshold > 3
    assert result.seconds <= _target(clean_seconds), (result.seconds, clean_seconds)


def test_loss_and_reordering_together(tmp_path, clean_seconds) -> None:
    both = Path(delay_s=RTT / 2, loss=0.01, reorder=0.01)
    result = transfer(tmp_path, size=SIZE, up=both, seed=3)
    assert result.seconds <= _target(clean_seconds), (result.seconds, clean_seconds)


RATE = 2e6  # bytes per second at the bottleneck
BDP = RATE * RTT


@pytest.mark.parametrize(("queue_bdp", "max_dropped"), [(2.0, 0.01), (0.25, 0.10)], ids=["deep queue", "shallow queue"])
def test_a_full_queue_still_makes_it_back_off(tmp_path, monkeypatch, queue_bdp, max_dropped) -> None:
    """A bottleneck link with a drop-tail queue: the controller keeps the drops few and the link busy;
    one that ignored loss would fill the queue and lose a large share of what it sends. (On a
    shallow queue, a quarter of the path's bandwidth-delay product, it drops more than NewReno,
    ~6 % against ~1 %: the heavy-loss rule waits an RTT before it believes the loss; see
    docs/performance.md, "Loss and reordering on the wire".)"""
    bottleneck = Path(delay_s=RTT / 2, rate_bytes_per_s=RATE, queue_bytes=int(queue_bdp * BDP))
    size = 4 << 20
    result = transfer(tmp_path / "t", size=size, up=bottleneck, seed=4)
    link = result.links["server"]
    dropped = link.queue_drops / (link.queue_drops + link.carried)
    assert link.queue_drops > 0 and result.controller.reductions > 0
    assert dropped < max_dropped, dropped
    assert size / result.seconds >= 0.7 * RATE, size / result.seconds  # the link stays busy

    monkeypatch.setattr(CongestionSignal, "is_congestion", lambda self, now: False)
    careless = transfer(tmp_path / "c", size=size, up=bottleneck, seed=4).links["server"]
    assert careless.queue_drops / (careless.queue_drops + careless.carried) > 2 * dropped
