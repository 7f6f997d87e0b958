"""tenzro_moeReputation over JSON-RPC and REST (an open read)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.reputation.services import reputation_credit, reputation_penalize

pytestmark = pytest.mark.django_db

A, B = "a" * 64, "b" * 64


def rpc(client, method: str, params: dict | None = None) -> dict:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, **({"params": params} if params is not None else {})}
    answer = client.post("/rpc", body, content_type="application/json").json()
    assert "error" not in answer, answer
    return answer["result"]


def test_reputation_lists_scores_floor_and_events(client) -> None:
    reputation_credit(provider_id=A, amount=Decimal("0.5"), reason="settlement", ref="fwd-1")
    reputation_penalize(provider_id=B, amount=Decimal(60), reason="dispute upheld", ref="dispute:1", fraud=True)
    result = rpc(client, "tenzro_moeReputation", {})
    assert result["reputation_floor"] == -50.0
    assert [(p["provider_id"], p["score"], p["below_floor"]) for p in result["providers"]] == [
        (A, "0.500000000000", False), (B, "-60.000000000000", True)]
    assert [(e["provider_id"], e["kind"]) for e in result["recent_events"]] == [(B, "fraud"), (A, "credit")]

    rest = client.get(f"/api/moe/reputation?provider_id={A}").json()
    assert [p["provider_id"] for p in rest["providers"]] == [A]
    assert rest["providers"][0]["credits_total"] == "0.500000000000"
    assert client.get("/api/moe/reputation?limit=5000").status_code == 422
