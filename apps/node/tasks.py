"""Celery tasks of the node app (adapters over plain functions)."""

import os

from celery import shared_task

from apps.node import liveness
from apps.node.selectors import redis_client
from apps.node.services import node_processes_announce


@shared_task(name="tenzro.node.heartbeat", ignore_result=True)
def node_heartbeat() -> None:
    """Beat → worker round trip: proves the Celery pipeline (beat, broker, worker) is alive."""
    liveness.stamp_celery_heartbeat(redis_client(), pid=os.getpid())


@shared_task(name="tenzro.node.processes_announce", ignore_result=True)
def node_processes_announce_task() -> None:
    """Beat tick: announce the process list to open dashboards (every TENZRO_DASHBOARD_PROCESSES_S)."""
    node_processes_announce()
