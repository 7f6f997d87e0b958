"""Gossip (sans-I/O) between in-memory nodes with real signed records."""

import pytest

from apps.providers.gossip import Gossip, Limits, MemoryStore
from testkit.gossip_sim import SimNetwork
from testkit.records import heartbeat, new_key, signed_record


def _network(n: int, **limits) -> SimNetwork:
    net = SimNetwork(limits=Limits(**limits))
    first = net.add(0, seeds=[])
    for i in range(1, n):
        net.add(i, seeds=[first.pid])  # everyone configured with one peer only
    return net


def test_nodes_configured_with_one_peer_learn_everyone() -> None:
    net = _network(12)
    rounds = net.run_until_converged()
    assert rounds <= 12
    assert net.counts()["forged"] == 0


def test_a_new_record_replaces_the_old_everywhere_and_is_not_resent_to_who_has_it() -> None:
    net = _network(8)
    net.run_until_converged()
    node = next(iter(net.nodes.values()))
    node.record = signed_record(node.key, seq=node.record.seq + 1, at_ms=net.now_ms, n_holdings=9)
    node.gossip.issue(node.record, heartbeat(node.key, seq=node.record.seq, at_ms=net.now_ms))
    net.run_until_converged()
    other = next(n for n in net.nodes.values() if n is not node)
    # the peer already holds this seq: a sync answer carries no record for it
    answer = node.gossip.answer_sync({pid: v for pid, v in other.gossip.store.digest().items()})
    assert answer["records"] == []


def test_a_silent_node_disappears_after_the_ttl() -> None:
    net = _network(6, ttl_ms=20_000)
    net.run_until_converged()
    quiet = list(net.nodes.values())[3]
    quiet.alive = False
    for i in range(8):  # 40 s of rounds: past the 20 s TTL
        net.round(round_no=i)
    assert all(quiet.pid not in n.known() for n in net.nodes.values() if n.alive)
    assert net.counts()["expired_removed"] >= 5


def test_replayed_forged_expired_skewed_and_oversized_records_are_refused_and_counted() -> None:
    me, them = new_key(10), new_key(11)
    gossip = Gossip(MemoryStore(), self_id=me.verify_key.encode().hex(), limits=Limits(ttl_ms=60_000,
                                                                                       max_record_bytes=4096))
    now = 10_000_000
    newer = signed_record(them, seq=5, at_ms=now)
    older = signed_record(them, seq=4, at_ms=now)
    assert gossip.receive([newer.envelope()], [], now_ms=now)["accepted"] == 1
    forged = {**newer.envelope(), "record": newer.text.replace('"seq":5', '"seq":6')}
    stale = signed_record(new_key(12), seq=1, at_ms=now - 61_000)
    future = signed_record(new_key(13), seq=1, at_ms=now + 120_000)
    huge = signed_record(new_key(14), seq=1, at_ms=now, n_holdings=60)
    verdicts = gossip.receive([older.envelope(), newer.envelope(), forged, stale.envelope(), future.envelope(),
                               huge.envelope()], [], now_ms=now)
    assert verdicts == {"replayed": 1, "duplicate": 1, "forged": 1, "expired": 1, "skewed": 1, "oversized": 1}
    assert set(gossip.store.digest()) == {newer.provider_id}
    # an old record kept alive by a fresh heartbeat of the same seq is current, not expired
    alive = signed_record(new_key(15), seq=2, at_ms=now - 61_000)
    assert gossip.receive([alive.envelope()], [heartbeat(new_key(15), seq=2, at_ms=now).to_json()],
                          now_ms=now)["accepted"] == 1


def test_future_timestamps_beyond_the_allowed_skew_are_refused_and_cannot_lock_a_provider_out() -> None:
    """A record or heartbeat dated past now + max_skew is `skewed`: dropped, counted, never stored.
    Accepted, a far-future record with a huge seq would outrank every honest record to come."""
    me, them = new_key(30), new_key(31)
    gossip = Gossip(MemoryStore(), self_id=me.verify_key.encode().hex(), limits=Limits(max_skew_ms=30_000))
    now = 50_000_000
    at_edge = signed_record(them, seq=3, at_ms=now + 30_000)  # exactly the allowed skew: accepted
    assert gossip.receive([at_edge.envelope()], [], now_ms=now) == {"accepted": 1}
    squatter = signed_record(new_key(32), seq=2**53, at_ms=now + 30_001)
    assert gossip.receive([squatter.envelope()], [], now_ms=now) == {"skewed": 1}
    assert set(gossip.store.digest()) == {at_edge.provider_id}
    # a heartbeat from the future neither counts as liveness nor keeps the record alive
    future_beat = heartbeat(them, seq=3, at_ms=now + 10 * 60_000)
    assert gossip.receive([], [future_beat.to_json()], now_ms=now) == {"skewed": 1}
    # the same record, once its time has come, is accepted from a later push
    later = now + 60_000
    assert gossip.receive([squatter.envelope()], [], now_ms=later) == {"accepted": 1}


def test_heartbeats_refresh_liveness_without_the_record() -> None:
    me, them = new_key(20), new_key(21)
    gossip = Gossip(MemoryStore(), self_id=me.verify_key.encode().hex(), limits=Limits(ttl_ms=30_000))
    record = signed_record(them, seq=3, at_ms=0)
    gossip.receive([record.envelope()], [], now_ms=0)
    gossip.receive([], [heartbeat(them, seq=3, at_ms=25_000).to_json()], now_ms=25_000)
    assert gossip.expire(now_ms=50_000) == []  # 25 s since the heartbeat
    assert gossip.expire(now_ms=56_000) == [record.provider_id]


@pytest.mark.parametrize("n", [40])
def test_convergence_stays_logarithmic(n: int) -> None:
    net = _network(n)
    assert net.run_until_converged() <= 4 * n.bit_length()
