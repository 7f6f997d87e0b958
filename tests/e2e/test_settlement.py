"""settle_forward through a real node's Celery worker: the same payload sent three times pays once."""

from __future__ import annotations

from decimal import Decimal

import pytest
from celery import Celery

pytestmark = pytest.mark.e2e

ROUTER, A, B = "e" * 64, "a" * 64, "b" * 64


def test_the_same_payload_sent_three_times_through_the_worker_pays_once(start_node, faults) -> None:
    node = start_node()
    router = node.result("tenzro_nodeInfo")["provider_id"]
    payload = {"forward_id": "fwd-e2e-1", "router_id": router, "model_id": "tiny-qwen3", "holders": [
        {"provider_id": A, "tokens": 90, "price_per_input_token": "0.000002", "commitments": ["11" * 32]},
        {"provider_id": B, "tokens": 10, "price_per_input_token": "0.000003", "commitments": ["22" * 32]},
        {"provider_id": router, "tokens": 40, "price_per_input_token": "0.000002", "commitments": []},
    ]}
    # The node's own broker and result backend (its Redis database): what the router's enqueue uses.
    app = Celery(broker=node.redis_url, backend=node.redis_url)
    fault = faults.inject("settlement delivered three times", "one settle_forward payload sent 3 times")
    try:
        sent = [app.send_task("tenzro.settlement.settle_forward", args=[payload]) for _ in range(3)]
        answers = [r.get(timeout=120) for r in sent]
    finally:
        app.close()
    assert len({a["settlement_id"] for a in answers}) == 1 and answers[0]["total"] == "0.000210000000"

    settlements = node.result("tenzro_moeSettlements", {})["settlements"]
    assert [s["forward_id"] for s in settlements] == ["fwd-e2e-1"] and len(settlements[0]["entries"]) == 6
    ledger = node.result("tenzro_moeLedger", {})
    assert ledger["totals"] == {"holder": "0.000189000000", "router": "0.000010500000", "burn": "0.000010500000"}
    assert {b["account"] for b in ledger["balances"] if b["kind"] == "router"} == {router}
    reputation = {p["provider_id"]: Decimal(p["score"]) for p in node.result("tenzro_moeReputation", {})["providers"]}
    assert reputation == {A: Decimal("0.000162"), B: Decimal("0.000027")}
    fault.observe("one settlement, 6 ledger entries, each holder credited once")
    fault.close(lost=0)
