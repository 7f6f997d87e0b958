"""Writes of the distributed forward: holder penalties, the latencies the planner ranks by, the
receipts its sampling kept, and its settlement (queued)."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.forward.models import ForwardRecord, HolderPenalty
from apps.forward.report import Failure
from apps.forward.selectors import forward_record_to_dict
from apps.forward.signals import forward_recorded
from apps.governance.selectors import policy_active
from apps.providers.services import provider_latency_record
from apps.receipts.services import receipt_record_many
from apps.reputation.services import reputation_penalize
from apps.settlement.services import settlement_enqueue
from core.transport.quic import SHUTTING_DOWN

# A primary raced out by its backup was slow, not wrong: it keeps its HolderPenalty row (the
# dashboard and the hedging numbers read them) but its reputation is not lowered.
# A stall (raced out, answered late) and a holder stopping cleanly cost it no reputation.
NOT_A_FAULT = frozenset({"stalled", SHUTTING_DOWN})


def forward_outcome_record(*, model_id: str, failures: Iterable[Failure], latencies_ms: dict[str, float],
                           self_id: str, wire_ns_per_byte: dict[str, float] | None = None) -> None:
    """One forward's failures become penalty rows, and each (but a stalled one) lowers its holder's
    reputation by the active policy's holder_failure_penalty; each winner's median latency, and its wire
    time per byte where measured, are folded into its provider's (this node's own is not a network
    latency and is skipped)."""
    failures = list(failures)
    if failures:
        _penalties_record(model_id=model_id, failures=failures)
    for provider_id, ms in latencies_ms.items():
        if provider_id != self_id:
            provider_latency_record(provider_id=provider_id, latency_ms=ms,
                                    wire_ns_per_byte=(wire_ns_per_byte or {}).get(provider_id))


@transaction.atomic  # a penalty row and its reputation event stand or fall together
def _penalties_record(*, model_id: str, failures: list[Failure]) -> None:
    rows = HolderPenalty.objects.bulk_create([
        HolderPenalty(provider_id=f.provider, reason=f.reason, message=f.message[:2000], model_id=model_id,
                      layer=f.layer, expert=f.expert, rows=f.rows)
        for f in failures])
    faults = [row for row in rows if row.reason not in NOT_A_FAULT]
    if not faults:
        return
    penalty = Decimal(str(policy_active().holder_failure_penalty))
    for row in faults:
        # bulk_create fills row.id on SQLite (3.35+) and PostgreSQL: the penalty's idempotency ref.
        reputation_penalize(provider_id=row.provider_id, amount=penalty, reason=row.reason, ref=f"penalty:{row.id}")


def forward_work_record(*, forward_id: str, router_id: str, model_id: str, kept: list[dict[str, Any]],
                        holders: list[dict[str, Any]]) -> None:
    """The verified remote work of one forward: the batches its sampling kept are persisted in
    full, and its settlement (each holder's tokens at its price, bound to the receipts'
    commitment hashes) is queued for the Celery worker once they are committed."""
    with transaction.atomic():
        if kept:
            receipt_record_many(router_id=router_id, kept=kept)
        if holders:
            settlement_enqueue(forward_id=forward_id, router_id=router_id, model_id=model_id, holders=holders)


def forward_stats_record(*, forward_id: str, model_id: str, tokens: int, stats: dict[str, Any],
                         missing: int) -> ForwardRecord:
    """One forward's stats (handlers._stats' dict) as a ForwardRecord; rows beyond the newest
    TENZRO_FORWARD_RECORDS_KEPT are deleted; forward_recorded is sent once it commits."""
    with transaction.atomic():
        record = ForwardRecord.objects.create(
            forward_id=forward_id, model_id=model_id, tokens=tokens, ok=missing == 0,
            elapsed_ms=stats.get("elapsed_ms"),
            batches=stats.get("batches", 0), retries=stats.get("retries", 0), replans=stats.get("replans", 0),
            hedges_fired=stats.get("hedges_fired", 0), missing=missing, stats=stats)
        # Ids grow with time: everything below the Nth newest id goes (one query for the bound, one delete).
        bound = ForwardRecord.objects.values_list("id", flat=True)[settings.TENZRO_FORWARD_RECORDS_KEPT:][:1]
        if bound:
            ForwardRecord.objects.filter(id__lte=bound[0]).delete()
        view = forward_record_to_dict(record)
        transaction.on_commit(lambda: forward_recorded.send(sender=ForwardRecord, forward=view))
    return record
