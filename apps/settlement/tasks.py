"""Celery task of the settlement app: an adapter over settlement_record."""

from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import OperationalError

from apps.settlement import services


@shared_task(
    name=services.SETTLE_TASK,
    acks_late=True,  # settlement_record is idempotent on forward_id: a redelivered payload pays once
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError,),  # a locked SQLite file, a dropped PostgreSQL connection
    retry_backoff=2,
    retry_backoff_max=120,
    max_retries=10,
)
def settle_forward(payload: dict[str, Any]) -> dict[str, Any]:
    """Settle one forward. ``payload``: {forward_id, router_id, model_id, holders: [{provider_id, tokens,
    price_per_input_token, commitments}]} (docs/operations.md, "Settlement")."""
    if not isinstance(payload, dict):
        raise TypeError(f"settle_forward takes one payload object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - {"forward_id", "router_id", "model_id", "holders"})
    if unknown:
        raise ValueError(f"settle_forward payload has unknown keys: {', '.join(unknown)}")
    settlement = services.settlement_record(forward_id=payload.get("forward_id"), router_id=payload.get("router_id"),
                                            model_id=payload.get("model_id"), holders=payload.get("holders"))
    return {"forward_id": settlement.forward_id, "settlement_id": settlement.pk, "total": format(settlement.total, "f")}


@worker_ready.connect
def resume_pending_settlements(**_: object) -> None:
    services.settlements_resume()


@shared_task(name="tenzro.settlement.sweep")
def sweep_pending_settlements() -> list[str]:
    """The periodic sweep of the outbox: settlements pending longer than a sweep interval are queued
    again (their message was lost: a Redis restart, a worker killed mid-task)."""
    return services.settlements_resume(older_than_s=settings.TENZRO_SETTLEMENT_SWEEP_S)
