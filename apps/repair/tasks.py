"""Celery tasks of the repair app: adapters over services."""

from celery import shared_task
from django.db import OperationalError

from apps.repair import services


@shared_task(name="tenzro.repair.tick", ignore_result=True, expires=30, autoretry_for=(OperationalError,),
             retry_backoff=2, max_retries=3)
def repair_tick_task() -> None:
    """Beat calls this every TENZRO_REPAIR_TICK_S; a pass runs only when the policy's interval says so."""
    services.repair_tick()


@shared_task(name=services.RUN_TASK, ignore_result=True, expires=600)
def repair_run_task() -> None:
    """A pass now (tenzro_moeRepairRun), whatever the schedule."""
    services.repair_pass_run(trigger="operator")
