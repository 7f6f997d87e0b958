"""Reads of the distributed forward's records."""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from apps.forward.models import HolderPenalty


def penalties_by_provider() -> dict[str, dict[str, int]]:
    """{provider_id: {reason: count}} over every recorded failure (one query)."""
    out: dict[str, dict[str, int]] = {}
    for pid, reason, n in HolderPenalty.objects.values_list("provider_id", "reason").annotate(n=Count("id")) \
            .order_by():
        out.setdefault(pid, {})[reason] = n
    return out


def penalties_recent(limit: int = 50) -> list[dict[str, Any]]:
    return list(HolderPenalty.objects.values("provider_id", "reason", "message", "model_id", "layer", "expert",
                                             "rows", "at")[:limit])
