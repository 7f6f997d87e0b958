"""The netem relay's core (seeded, sans-I/O) and one relay on loopback against a UDP echo."""

from __future__ import annotations

import random

import pytest

from testkit import netem
from testkit.netem import DelayLine, Impairment, RelayThread, UdpEcho, udp_ping


def line(**kwargs) -> DelayLine:
    return DelayLine(Impairment(**kwargs), random.Random(1))


def test_delay_is_per_datagram_not_serialized() -> None:
    d = line(delay_ms=50)
    for i in range(100):  # a burst of 100 datagrams in 1 ms
        d.push(i * 1e-5, i)
    assert d.pop_due(0.049) == []
    assert d.pop_due(0.0511) == list(range(100))  # all leave 50 ms after they came, in order


def test_jitter_keeps_order_unless_reorder_is_asked() -> None:
    d = line(delay_ms=10, jitter_ms=5, jitter="uniform")
    for i in range(1000):
        d.push(i * 1e-4, i)
    assert d.pop_due(10.0) == list(range(1000))
    r = line(delay_ms=10, reorder=0.1)
    for i in range(1000):
        r.push(i * 1e-4, i)
    out = r.pop_due(10.0)
    assert sorted(out) == list(range(1000)) and out != list(range(1000))
    assert 50 < r.counters.reordered < 150


def test_loss_is_seeded_and_near_its_probability() -> None:
    runs = []
    for _ in range(2):
        d = line(loss=0.02)
        for i in range(20_000):
            d.push(0.0, i)
        runs.append(d.pop_due(1.0))
    assert runs[0] == runs[1]  # the same seed drops the same datagrams
    assert 300 < 20_000 - len(runs[0]) < 500


def test_bad_impairments_are_refused() -> None:
    with pytest.raises(ValueError):
        Impairment(loss=1.5)
    with pytest.raises(ValueError):
        Impairment(jitter="pareto")


def test_a_relay_adds_its_delay_to_a_ping() -> None:
    echo = UdpEcho()
    try:
        with RelayThread() as relays:
            relay = relays.add(listen=("127.0.0.1", 0), target=echo.address, impairment=Impairment(delay_ms=10))
            ping = udp_ping(relay.listen, count=20, interval_s=0.002)
            assert ping.lost == 0 and ping.percentile(50) >= 20.0  # 10 ms each way
            relays.set_impairment(Impairment(loss=1.0))
            assert udp_ping(relay.listen, count=5, timeout_s=0.2).lost == 5
    finally:
        echo.close()


def test_a_relay_closes_the_sockets_of_clients_gone_silent(monkeypatch) -> None:
    """Every QUIC connection a node opens comes from a port of its own; a relay that kept a socket per
    client for ever passed the benchmark's fd limit over a long run."""
    monkeypatch.setattr(netem, "UPSTREAM_IDLE_S", 0.0)
    echo = UdpEcho()
    try:
        with RelayThread() as relays:
            relay = relays.add(listen=("127.0.0.1", 0), target=echo.address)
            for _ in range(130):  # each ping is a client of its own (a fresh source port)
                assert udp_ping(relay.listen, count=1, timeout_s=0.5).lost == 0
            assert 0 < relays.call(lambda: len(relay._upstreams)) < 70
    finally:
        echo.close()
