"""A generation's ledger: every layer of every step adds to it, and it holds one settlement row per
holder (its rows summed, its commitments in order), the kept batches, the failures and one latency
median per holder. Pure."""

from __future__ import annotations

from apps.forward.callers import VerifiedBatch
from apps.forward.ledger import ForwardWork
from apps.forward.report import Failure, ForwardReport, HolderStats
from apps.receipts.commitment import SignedReceipt

RECEIPT = SignedReceipt({"v": 2}, "c" * 64, "s" * 128)


def _report(step: int) -> ForwardReport:
    a = HolderStats("a", batches=2, rows=3, latencies_s=[0.004, 0.006], overheads_s=[0.001, 0.003],
                    receipts=[VerifiedBatch(RECEIPT, step == 1, b"sk", b"carrier", f"a{step}{i}", 0, i, i)
                              for i in range(2)])
    b = HolderStats("b", batches=1, rows=1, latencies_s=[0.010],
                    receipts=[VerifiedBatch(RECEIPT, False, None, None, f"b{step}", 0, 5, None)])
    me = HolderStats("me", batches=1, rows=4, latencies_s=[0.0001])  # this node's own experts: no receipt
    failures = [Failure("c", "timeout", "slow", 0, 7, 2)] if step == 0 else []
    return ForwardReport(holders={"a": a, "b": b, "me": me}, failures=failures)


def test_every_layer_of_a_generation_adds_to_one_settlement_per_holder() -> None:
    work = ForwardWork()
    assert not work
    for step in range(3):
        work.add(_report(step), self_id="me", prices={"a": "0.1", "b": "0.2"}, blob_of={("a", 0, 1): "tenzro://x"})
    assert work.holder_rows() == [
        {"provider_id": "a", "tokens": 9, "price_per_input_token": "0.1",
         "commitments": ["a00", "a01", "a10", "a11", "a20", "a21"]},
        {"provider_id": "b", "tokens": 3, "price_per_input_token": "0.2", "commitments": ["b0", "b1", "b2"]}]
    assert [(k["commitment"], k["batch"], k["blob_uri"]) for k in work.kept] == [("a10", 0, None),
                                                                                ("a11", 1, "tenzro://x")]
    assert [f.provider for f in work.failures] == ["c"]
    medians = work.latency_medians()
    assert medians["a"] == 2.0 and medians["b"] == 10.0  # the wire's share where a holder reported compute
    assert "me" in medians  # measured, and skipped by the writer (not a network latency)
    assert work


def test_a_quic_holders_latency_is_its_paths_round_trip_not_the_time_its_rows_took() -> None:
    """On a lossy path the wire's share grows with the rows a holder was given: fed back, the holder that
    answered faster got every row of the next forward (the planner pays latency once per holder)."""
    loaded = HolderStats("a", batches=16, rows=256, latencies_s=[0.30, 0.35], overheads_s=[0.28, 0.33],
                         rtts_s=[0.031, 0.033])
    http = HolderStats("b", batches=1, rows=4, latencies_s=[0.012], overheads_s=[0.009])  # no QUIC path to read
    work = ForwardWork()
    work.add(ForwardReport(holders={"a": loaded, "b": http}), self_id="me", prices={}, blob_of={})
    assert work.latency_medians() == {"a": 32.0, "b": 9.0}


def test_a_holders_wire_time_per_byte_is_its_slowest_request_beyond_round_trip_and_compute() -> None:
    """What the planner weighs a holder's rows by, measured only where bytes, not fixed costs, dominate."""
    lossy = HolderStats("a", batches=16, rows=128, bytes_sent=500_000, bytes_received=500_000,
                        latencies_s=[0.20, 0.25], overheads_s=[0.19, 0.23], rtts_s=[0.031, 0.029, 0.030])
    decode = HolderStats("b", batches=1, rows=8, bytes_sent=8_000, bytes_received=8_000, latencies_s=[0.002],
                         overheads_s=[0.001], rtts_s=[0.0002])  # a decode step: 16 KB, mostly fixed costs
    http = HolderStats("c", batches=1, rows=128, bytes_sent=500_000, bytes_received=500_000, latencies_s=[0.2],
                       overheads_s=[0.1])  # no QUIC round trip to take away
    quick = HolderStats("d", batches=1, rows=128, bytes_sent=500_000, bytes_received=500_000, latencies_s=[0.03],
                        overheads_s=[0.02], rtts_s=[0.03])  # beyond its round trip: nothing
    mine = HolderStats("me", batches=1, rows=128, bytes_sent=500_000, bytes_received=500_000, latencies_s=[0.2],
                       overheads_s=[0.19], rtts_s=[0.03])
    assert abs(lossy.wire_ns_per_byte() - 200.0) < 1e-9  # (0.23 - 0.030) s over 1 MB
    assert decode.wire_ns_per_byte() is None and http.wire_ns_per_byte() is None
    assert quick.wire_ns_per_byte() == 0.0
    assert lossy.to_dict()["wire_ns_per_byte"] == 200.0 and decode.to_dict()["wire_ns_per_byte"] is None
    work = ForwardWork()
    for _ in range(2):
        work.add(ForwardReport(holders={"a": lossy, "b": decode, "c": http, "d": quick, "me": mine}), self_id="me",
                 prices={}, blob_of={})
    other = ForwardWork()
    other.add(ForwardReport(holders={"a": HolderStats("a", batches=1, rows=128, bytes_sent=1_000_000, rtts_s=[0.03],
                                                      latencies_s=[0.5], overheads_s=[0.53])}),
              self_id="me", prices={}, blob_of={})
    work.absorb(other)
    assert {pid: round(v, 6) for pid, v in work.wire_medians().items()} == {"a": 200.0, "d": 0.0}
    assert work.wire_ns_per_byte["a"][-1] == 500.0  # absorbed
