"""Celery tasks of the node app (adapters over plain functions)."""

import os

from celery import shared_task

from apps.node import liveness
from apps.node.selectors import redis_client


@shared_task(name="tenzro.node.heartbeat", ignore_result=True)
def node_heartbeat() -> None:
    """Beat → worker round trip: proves the Celery pipeline (beat, broker, worker) is alive."""
    liveness.stamp_celery_heartbeat(redis_client(), pid=os.getpid())
