"""Peer admission (sans-I/O): streams in flight and the token bucket, with an explicit clock."""

import pytest

from core.transport.admission import PeerAdmission, PeerLimits, PeerTable, peer_key


def test_streams_in_flight_are_capped_and_released() -> None:
    admission = PeerAdmission(PeerLimits(max_body=1, max_streams=2, rate_per_s=1000, burst=1000), now=0.0)
    assert admission.admit(0.0) is None and admission.admit(0.0) is None
    refusal = admission.admit(0.0)
    assert refusal is not None and refusal.reason == "too_many_streams" and "2 requests" in refusal.message
    admission.release()
    assert admission.admit(0.0) is None
    assert admission.in_flight == 2 and admission.refused == 1


def test_rate_limit_refills_at_the_configured_rate() -> None:
    admission = PeerAdmission(PeerLimits(max_body=1, max_streams=100, rate_per_s=10, burst=3), now=0.0)
    for _ in range(3):
        assert admission.admit(0.0) is None
        admission.release()
    refusal = admission.admit(0.0)
    assert refusal is not None and refusal.reason == "rate_limited" and "retry in 0.100 s" in refusal.message
    assert admission.admit(0.05) is not None  # half a token
    assert admission.admit(0.2) is None  # refilled
    admission.release()
    # the bucket never holds more than the burst, however long the peer was quiet
    for _ in range(3):
        assert admission.admit(1000.0) is None
        admission.release()
    assert admission.admit(1000.0).reason == "rate_limited"


def test_release_without_admit_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        PeerAdmission(PeerLimits(max_body=1), now=0.0).release()


def _limits(**overrides) -> PeerLimits:
    return PeerLimits(**{"max_body": 1, "max_streams": 100, "rate_per_s": 10, "burst": 5,
                         "max_peer_streams": 1000, **overrides})


def test_connections_of_one_host_share_its_bucket() -> None:
    """A peer that opens more connections gets no more requests through than one connection."""
    table = PeerTable(_limits())
    connections = [PeerAdmission(table.limits, now=0.0, table=table, host="203.0.113.7") for _ in range(4)]
    admitted = sum(c.admit(0.0) is None for c in connections for _ in range(5))
    assert admitted == 5  # the burst, once, not 4 x 5
    other = PeerAdmission(table.limits, now=0.0, table=table, host="203.0.113.8")
    assert other.admit(0.0) is None  # another host has its own bucket
    assert connections[0].admit(0.1) is None  # one token refilled (10/s) for the whole host


def test_requests_in_flight_are_capped_per_peer_over_its_connections() -> None:
    table = PeerTable(_limits(burst=100, max_streams=3, max_peer_streams=4))
    a, b = (PeerAdmission(table.limits, now=0.0, table=table, host="198.51.100.1") for _ in range(2))
    assert [a.admit(0.0) is None for _ in range(3)] == [True, True, True]
    assert a.admit(0.0).reason == "too_many_streams"  # the connection's own cap (3)
    assert b.admit(0.0) is None
    refusal = b.admit(0.0)
    assert refusal.reason == "too_many_streams" and "from this peer" in refusal.message  # the peer's cap (4)
    a.release()
    assert b.admit(0.0) is None


def test_per_connection_mode_gives_each_connection_its_own_bucket() -> None:
    table = PeerTable(_limits(per_connection=True))
    connections = [PeerAdmission(table.limits, now=0.0, table=table, host="127.0.0.1") for _ in range(3)]
    assert sum(c.admit(0.0) is None for c in connections for _ in range(5)) == 15
    for c in connections:
        for _ in range(5):
            c.release()
        c.close()
    assert len(table) == 0  # each connection's bucket went with it


def test_connections_per_host_are_capped_and_counted_down() -> None:
    table = PeerTable(_limits(max_connections_per_host=2))
    assert table.connect("192.0.2.1", 0.0) is None and table.connect("192.0.2.1", 0.0) is None
    assert table.connect("192.0.2.1", 0.0).reason == "too_many_connections"
    assert table.connect("192.0.2.2", 0.0) is None
    table.disconnect("192.0.2.1")
    assert table.connect("192.0.2.1", 0.0) is None


def test_a_peer_is_an_ipv4_host_or_an_ipv6_network() -> None:
    assert peer_key("203.0.113.7") == "203.0.113.7"
    assert peer_key("2001:db8:1:2:aaaa::1") == peer_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") != peer_key("2001:db8:1:2::1")
    assert peer_key("2001:db8:1:2::1", ipv6_prefix=128) == "2001:db8:1:2::1/128"
    assert peer_key("::ffff:198.51.100.4") == "198.51.100.4"  # an IPv4 peer on a dual-stack socket
    assert peer_key("fe80::1%eth0") == "fe80::/64"
    assert peer_key("?") == "?"


def test_idle_peers_are_forgotten_only_once_their_bucket_is_full_again() -> None:
    table = PeerTable(_limits(), max_tracked=2)
    for host in ("a", "b"):
        assert table.admit(host, 0.0) is None
        table.release(host)
    table.admit("c", 0.1)  # full table, nobody idle long enough (5 tokens at 10/s: 0.5 s): kept
    assert len(table) == 3
    table.admit("d", 0.9)  # a and b have refilled, but the last sweep was under a second ago
    assert len(table) == 4
    table.admit("e", 1.2)  # now a and b go: forgetting them hands them nothing they would not have
    assert len(table) == 3
