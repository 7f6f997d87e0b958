"""Celery tasks of the receipts app: adapters over services."""

from celery import shared_task
from django.db import OperationalError

from apps.receipts import services
from core.errors import TenzroError


class ExpertUnavailable(Exception):
    """The expert's weights could not be had this time (no peer answered): retried with backoff."""


@shared_task(name=services.DISPUTE_TASK, acks_late=True,  # idempotent: a decided dispute is left as is
             reject_on_worker_lost=True, autoretry_for=(ExpertUnavailable, OperationalError), retry_backoff=5,
             retry_backoff_max=120, max_retries=5, ignore_result=True)
def dispute_run_task(dispute_id: int) -> None:
    try:
        services.dispute_run(dispute_id=dispute_id)
    except TenzroError as exc:
        if exc.reason == "expert_unavailable":
            raise ExpertUnavailable(exc.message) from exc
        raise


@shared_task(name="tenzro.receipts.prune", ignore_result=True)
def receipts_prune_task() -> None:
    services.receipts_prune()
