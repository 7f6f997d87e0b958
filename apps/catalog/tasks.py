"""Celery tasks of the catalog app: adapters over services."""

from celery import shared_task
from celery.signals import worker_ready
from django.db import OperationalError

from apps.catalog import services


@shared_task(
    name=services.PREPARE_TASK,
    acks_late=True,  # the service is idempotent: a redelivered job publishes the same blobs
    reject_on_worker_lost=True,
    autoretry_for=(services.JobBusy, OperationalError),
    retry_backoff=5,
    retry_backoff_max=60,
    max_retries=30,
    ignore_result=True,
)
def prepare_job_task(job_id: str) -> None:
    services.prepare_job_run(job_id=job_id)


@worker_ready.connect
def resume_prepare_jobs(**_: object) -> None:
    services.prepare_jobs_resume()
