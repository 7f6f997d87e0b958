"""Reads of reputation: the scores the planner ranks by, and the rows the API lists."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apps.reputation.models import Reputation, ReputationEvent


def reputation_scores(provider_ids: Iterable[str] | None = None) -> dict[str, float]:
    """{provider_id: score} in one query; providers with no events are absent (their score is 0).

    Floats, for the planner's pure views: a rank and a floor need no more than float precision.
    """
    rows = Reputation.objects.all()
    if provider_ids is not None:
        rows = rows.filter(provider_id__in=list(provider_ids))
    return {pid: float(score) for pid, score in rows.values_list("provider_id", "score").order_by()}


def reputation_rows(limit: int = 100, *, provider_id: str | list[str] | None = None,
                    offset: int = 0) -> list[dict[str, Any]]:
    """The highest scores first (ties: provider id), at most `limit` rows from `offset`, one query;
    `provider_id`: one provider's row, or those of several."""
    rows = Reputation.objects.order_by("-score", "provider_id")
    if isinstance(provider_id, list):
        rows = rows.filter(provider_id__in=provider_id)
    elif provider_id is not None:
        rows = rows.filter(provider_id=provider_id)
    return list(rows.values("provider_id", "score", "credits_total", "penalties_total", "credit_count",
                            "penalty_count", "updated_at")[offset:offset + limit])


def reputation_events(limit: int = 50, *, provider_id: str | None = None) -> list[dict[str, Any]]:
    """The most recent events, newest first (one query)."""
    rows = ReputationEvent.objects.order_by("-at", "-id")
    if provider_id is not None:
        rows = rows.filter(provider_id=provider_id)
    return list(rows.values("provider_id", "kind", "amount", "reason", "ref", "at")[:limit])
