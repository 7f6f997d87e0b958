"""The simulation's optional parts (testkit/gossip_sim.py) change its cost, never its outcome."""

import random

import pytest

import apps.providers.gossip as gossip_module
from apps.providers.gossip import Limits, MemoryStore
from apps.providers.records import RecordError
from testkit.gossip_sim import (
    KINDS,
    IndexedStore,
    SimNetwork,
    converged_network,
    verify_once_per_envelope,
    wire_size,
)
from testkit.records import heartbeat, new_key, signed_record


def _network(n: int, *, seed: int = 3, **kw) -> SimNetwork:
    net = SimNetwork(limits=Limits(ttl_ms=20_000), rng=random.Random(seed), **kw)
    first = net.add(0, seeds=[])
    for i in range(1, n):
        net.add(i, seeds=[first.pid])
    return net


def _run(net: SimNetwork) -> dict:
    """Converge, then let one node fall silent past the TTL: joins, rumors, heartbeats and removals."""
    rounds = net.run_until_converged()
    list(net.nodes.values())[5].alive = False
    for i in range(8):
        net.round(round_no=rounds + 1 + i)
    return {"rounds": rounds, "counts": net.counts(), "now": net.now_ms,
            "digests": {pid: n.gossip.store.digest() for pid, n in net.nodes.items()},
            "sent": {pid: (n.sent_bytes, n.sent_by_kind) for pid, n in net.nodes.items()}}


def test_an_indexed_store_and_verification_once_per_envelope_change_no_outcome() -> None:
    plain = _run(_network(14, store_factory=MemoryStore))
    assert plain["counts"]["expired_removed"] >= 12  # the removal path ran
    assert _run(_network(14, store_factory=IndexedStore)) == plain
    real = gossip_module.verify_record
    with verify_once_per_envelope() as counts:
        assert _run(_network(14, store_factory=IndexedStore)) == plain
    assert gossip_module.verify_record is real  # restored on exit
    assert 0 < counts["verified"] < counts["reused"]


def test_bytes_by_kind_add_up_to_the_bytes_sent() -> None:
    net = _network(10)
    net.run_until_converged()
    for node in net.nodes.values():
        assert set(node.sent_by_kind) <= set(KINDS)
        assert sum(node.sent_by_kind.values()) == node.sent_bytes
    assert all(sum(n.sent_by_kind[k] for n in net.nodes.values()) > 0 for k in ("push", "sync", "ack"))


def test_a_remembered_refusal_is_refused_again() -> None:
    record = signed_record(new_key(40), seq=2)
    forged = {**record.envelope(), "record": record.text.replace('"seq":2', '"seq":3')}
    with verify_once_per_envelope() as counts:
        for _ in range(2):
            with pytest.raises(RecordError) as refused:
                gossip_module.verify_record(forged, max_bytes=1 << 20)
            assert refused.value.reason == "forged"
        assert gossip_module.verify_record(record.envelope(), max_bytes=1 << 20) is \
            gossip_module.verify_record(record.envelope(), max_bytes=1 << 20)
        with pytest.raises(RecordError) as oversized:  # max_bytes is part of what is remembered
            gossip_module.verify_record(record.envelope(), max_bytes=10)
        assert oversized.value.reason == "oversized"
        beat = heartbeat(new_key(40), seq=2, at_ms=5).to_json()
        assert gossip_module.verify_heartbeat(beat) is gossip_module.verify_heartbeat(dict(beat))
        for _ in range(2):  # True == 1 and hashes alike: a bool seq is checked (and refused) every time
            with pytest.raises(RecordError, match="heartbeat needs"):
                gossip_module.verify_heartbeat({**beat, "seq": True})
    assert counts == {"verified": 4, "reused": 3}


def test_a_message_refused_whole_raises_unless_dropped() -> None:
    net = _network(2)
    node = next(iter(net.nodes.values()))
    huge = {"records": [node.record.envelope()] * (2 * net.limits.max_items_per_message + 1), "heartbeats": []}
    with pytest.raises(RecordError):
        net._receive(node, huge)
    net.drop_refused = True
    net._receive(node, huge)
    assert net.refused == {"oversized": 1}


def test_a_converged_network_stays_converged_and_resends_no_record() -> None:
    net = converged_network(10)
    assert net.converged()
    for i in range(12):  # a minute of 5 s rounds, heartbeats re-signed every third
        net.round(round_no=i)
    assert net.converged()
    counts = net.counts()
    # no record travelled at all (a resent one would count as a duplicate): only offers, digests
    # and heartbeats, which flow both ways in a sync (the ack2 carries the ones the peer wanted)
    assert counts["accepted"] == counts["duplicate"] == counts["expired_removed"] == 0


def test_message_size_is_the_wire_size() -> None:
    net = _network(6)
    net.run_until_converged()
    node = next(iter(net.nodes.values()))
    entries = list(node.gossip.store.entries(node.known()).values())
    messages = [node.gossip.records_for(node.known()), node.gossip.answer_sync({}), node.gossip.push_message(),
                node.gossip.sync_request(), {"records": [entries[0].record.envelope()], "heartbeats": []}]
    assert messages[0]["records"] and messages[1]["records"]
    for message in messages * 2:  # the second time from remembered envelope sizes
        assert net.message_size(message) == wire_size(message)
