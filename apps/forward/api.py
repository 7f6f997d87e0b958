"""JSON-RPC/REST reads of the distributed forward's records (`tenzro_moeHolderPenalties`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import Out, QueryParams
from apps.forward import selectors


class PenaltiesParams(QueryParams):
    limit: int = Field(50, ge=0, le=1000, description="How many of the most recent penalties to list.")


class PenaltyRow(Out):
    provider_id: str
    reason: str
    message: str
    model_id: str
    layer: int
    expert: int
    rows: int
    at: datetime


class PenaltiesOut(Out):
    by_provider: dict[str, dict[str, int]] = Field(description="{provider_id: {reason: count}}")
    recent: list[PenaltyRow]


@rpc_method("tenzro_moeHolderPenalties", rest="/moe/penalties", http_method="GET", tag="moe",
            params=PenaltiesParams, response=PenaltiesOut)
def holder_penalties(params: PenaltiesParams) -> dict[str, Any]:
    """Holders this node's forwards saw fail (timeout, connection_failed, stalled, …), for reputation."""
    return {"by_provider": selectors.penalties_by_provider(), "recent": selectors.penalties_recent(params.limit)}
