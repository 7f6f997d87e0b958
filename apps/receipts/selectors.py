"""Reads of receipts and disputes."""

from __future__ import annotations

from typing import Any

from apps.receipts.models import Dispute, Receipt

RECEIPT_LIST_FIELDS = ("id", "commitment_hash", "provider_id", "model_id", "layer", "expert", "tokens",
                       "created_at", "dispute__state")


def receipts_list(*, model_id: str | None = None, provider_id: str | list[str] | None = None, limit: int = 50,
                  commitment_hashes: list[str] | None = None, expert: int | None = None,
                  offset: int = 0) -> list[dict[str, Any]]:
    """The most recent kept receipts (one query), newest first, with their dispute's state if any;
    `offset` skips that many (a page); `provider_id` is one id or any of several."""
    rows = Receipt.objects.all()
    if commitment_hashes is not None:
        rows = rows.filter(commitment_hash__in=commitment_hashes)
    if model_id:
        rows = rows.filter(model_id=model_id)
    if isinstance(provider_id, list):
        rows = rows.filter(provider_id__in=provider_id)
    elif provider_id:
        rows = rows.filter(provider_id=provider_id)
    if expert is not None:
        rows = rows.filter(expert=expert)
    out = []
    for row in rows.values(*RECEIPT_LIST_FIELDS)[offset:offset + limit]:
        row["dispute"] = row.pop("dispute__state")
        out.append(row)
    return out


def receipts_count() -> int:
    return Receipt.objects.count()


def dispute_view(dispute: Dispute) -> dict[str, Any]:
    return {"receipt_id": dispute.receipt_id, "dispute_id": dispute.pk, "state": dispute.state,
            "difference": dispute.difference, "tolerance": dispute.tolerance, "detail": dispute.detail,
            "signature_valid": dispute.signature_valid, "penalty": dispute.penalty, "error": dispute.error,
            "verifier_id": dispute.verifier_id, "verdict": dispute.verdict, "reexecuted_here": dispute.reexecuted_here,
            "attempts": dispute.attempts, "opened_at": dispute.opened_at, "decided_at": dispute.decided_at}
