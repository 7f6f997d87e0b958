"""JSON-RPC/REST read of provider reputation (`tenzro_moeReputation`), open to anyone."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import Out, QueryParams
from apps.governance.selectors import policy_active
from apps.reputation import selectors

_AMOUNT = "Decimal string with 12 decimal places."


def decimal_text(value: Decimal) -> str:
    """Fixed-point text: str() would write a zero with 12 places as '0E-12'."""
    return format(value, "f")


class ReputationParams(QueryParams):
    limit: int = Field(100, ge=0, le=1000, description="How many providers (highest score first) and events.")
    provider_id: str | None = Field(None, min_length=1, max_length=64, description="Only this provider.")


class ReputationRow(Out):
    provider_id: str
    score: str = Field(description=_AMOUNT)
    credits_total: str = Field(description=_AMOUNT)
    penalties_total: str = Field(description=_AMOUNT)
    credit_count: int
    penalty_count: int
    below_floor: bool = Field(description="score < the policy's reputation_floor: the planner skips it.")
    updated_at: datetime


class ReputationEventRow(Out):
    provider_id: str
    kind: Literal["credit", "penalty", "fraud"]
    amount: str = Field(description=_AMOUNT)
    reason: str
    ref: str
    at: datetime


class ReputationOut(Out):
    reputation_floor: float
    providers: list[ReputationRow] = Field(description="Providers with any event; the others score 0.")
    recent_events: list[ReputationEventRow]


@rpc_method("tenzro_moeReputation", rest="/moe/reputation", http_method="GET", tag="moe",
            params=ReputationParams, response=ReputationOut, errors=(404,))
def reputation(params: ReputationParams) -> dict[str, Any]:
    """Provider reputation as this node sees it: scores (penalties down, settlement credits up) and recent events."""
    floor = policy_active().reputation_floor
    rows = selectors.reputation_rows(params.limit, provider_id=params.provider_id)
    events = selectors.reputation_events(params.limit, provider_id=params.provider_id)
    amounts = ("score", "credits_total", "penalties_total")
    return {
        "reputation_floor": floor,
        "providers": [{**r, **{k: decimal_text(r[k]) for k in amounts}, "below_floor": r["score"] < Decimal(str(floor))}
                      for r in rows],
        "recent_events": [{**e, "amount": decimal_text(e["amount"])} for e in events],
    }
