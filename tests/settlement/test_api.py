"""tenzro_moeSettlements and tenzro_moeLedger over JSON-RPC and REST (open reads)."""

from __future__ import annotations

import pytest

from apps.settlement.services import settlement_record

pytestmark = pytest.mark.django_db

ROUTER, A = "r" * 64, "a" * 64


def rpc(client, method: str, params: dict) -> dict:
    answer = client.post("/rpc", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                         content_type="application/json").json()
    assert "error" not in answer, answer
    return answer["result"]


def settle(forward_id: str, tokens: int) -> None:
    settlement_record(forward_id=forward_id, router_id=ROUTER, model_id="m", holders=[
        {"provider_id": A, "tokens": tokens, "price_per_input_token": "0.000002", "commitments": ["ab" * 32]}])


def test_settlements_list_the_newest_with_their_entries(client, django_assert_max_num_queries) -> None:
    settle("fwd-1", 90)
    settle("fwd-2", 10)
    with django_assert_max_num_queries(2):
        result = rpc(client, "tenzro_moeSettlements", {"limit": 5})
    first = result["settlements"][1]
    assert [s["forward_id"] for s in result["settlements"]] == ["fwd-2", "fwd-1"]
    assert first["total"] == "0.000180000000" and first["commitments"] == ["ab" * 32]
    assert [(e["account"], e["kind"], e["amount"]) for e in first["entries"]] == [
        (A, "holder", "0.000162000000"), (ROUTER, "router", "0.000009000000"), ("burn", "burn", "0.000009000000")]
    rest = client.get("/api/moe/settlements?forward_id=fwd-1").json()
    assert [s["forward_id"] for s in rest["settlements"]] == ["fwd-1"]


def test_the_ledger_sums_per_account_and_kind(client) -> None:
    settle("fwd-1", 90)
    settle("fwd-2", 10)
    result = rpc(client, "tenzro_moeLedger", {})
    assert [(b["account"], b["kind"], b["amount"], b["entries"]) for b in result["balances"]] == [
        (A, "holder", "0.000180000000", 2), ("burn", "burn", "0.000010000000", 2),
        (ROUTER, "router", "0.000010000000", 2)]
    assert result["totals"] == {"holder": "0.000180000000", "router": "0.000010000000", "burn": "0.000010000000"}
    only = client.get(f"/api/moe/ledger?account={ROUTER}").json()
    assert [b["account"] for b in only["balances"]] == [ROUTER]
