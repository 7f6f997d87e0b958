"""Reads of settlement: recent settlements with their entries, and balances per ledger account."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, Sum

from apps.settlement.models import LedgerEntry, Settlement
from apps.settlement.split import QUANTUM


def settlements_recent(limit: int = 50, *, forward_id: str | None = None) -> list[Settlement]:
    """The newest settlements, each with its ledger entries (two queries whatever the limit)."""
    rows = Settlement.objects.order_by("-created_at", "-id")
    if forward_id is not None:
        rows = rows.filter(forward_id=forward_id)
    return list(rows.prefetch_related(Prefetch("entries", queryset=LedgerEntry.objects.order_by("id")))[:limit])


def ledger_balances(*, account: str | list[str] | None = None, limit: int | None = None,
                    offset: int = 0) -> list[dict[str, Any]]:
    """[{account, kind, amount (sum), entries (count)}] sorted by account then kind, one query;
    `account`: one account's, or those of several; `limit`/`offset`: one page of them."""
    rows = LedgerEntry.objects.all()
    if isinstance(account, list):
        rows = rows.filter(account__in=account)
    elif account is not None:
        rows = rows.filter(account=account)
    sums = (rows.values("account", "kind").annotate(amount=Sum("amount"), entries=Count("id"))
            .order_by("account", "kind"))
    if limit is not None:
        sums = sums[offset:offset + limit]
    # Back to the columns' 12 places: SQLite sums REALs and hands back more digits than the entries have.
    return [{**row, "amount": row["amount"].quantize(QUANTUM)} for row in sums]
