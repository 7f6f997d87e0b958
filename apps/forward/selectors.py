"""Reads of the distributed forward's records."""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from apps.forward.models import ForwardRecord, HolderPenalty


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


def forward_record_to_dict(record: ForwardRecord) -> dict[str, Any]:
    return {"forward_id": record.forward_id, "model_id": record.model_id, "tokens": record.tokens, "ok": record.ok,
            "elapsed_ms": record.elapsed_ms, "batches": record.batches, "retries": record.retries,
            "replans": record.replans, "hedges_fired": record.hedges_fired,
            "hedges_won": record.stats.get("hedges_won", 0), "missing": record.missing,
            "holders": record.stats.get("holders", []), "failures": record.stats.get("failures", []),
            "at": record.at.isoformat()}


def forwards_recent(*, limit: int = 50, offset: int = 0, model_id: str | None = None,
                    ok: bool | None = None) -> list[dict[str, Any]]:
    """The most recent forwards this node routed, newest first (one query); `offset` skips that many,
    `model_id` and `ok` (answered / failed closed) narrow them."""
    rows = ForwardRecord.objects.all()
    if model_id:
        rows = rows.filter(model_id=model_id)
    if ok is not None:
        rows = rows.filter(ok=ok)
    return [forward_record_to_dict(r) for r in rows[offset:offset + limit]]
