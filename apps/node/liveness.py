"""Process liveness records kept in the node's Redis database.

The supervisor (`tenzro node run`) writes what it knows of each child process; the
Celery worker stamps each heartbeat task it runs. Keys expire, so a dead supervisor or
a stalled Celery pipeline shows up as missing rather than as stale "alive".
Plain module (no Django): the supervisor uses it before Django exists.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

PROCESSES_KEY = "tenzro:node:processes"
CELERY_HEARTBEAT_KEY = "tenzro:node:celery-heartbeat"
# Written every SUPERVISOR_INTERVAL_S; expires after a few missed writes.
SUPERVISOR_INTERVAL_S = 2.0
PROCESSES_TTL_S = 10
CELERY_HEARTBEAT_TTL_S = 60


def write_processes(client: redis.Redis, processes: list[dict[str, Any]]) -> None:
    record = {"written_at": time.time(), "processes": processes}
    client.set(PROCESSES_KEY, json.dumps(record), ex=PROCESSES_TTL_S)


def clear_processes(client: redis.Redis) -> None:
    client.delete(PROCESSES_KEY)


def read_processes(client: redis.Redis) -> dict[str, Any] | None:
    raw = client.get(PROCESSES_KEY)
    return None if raw is None else json.loads(raw)


def stamp_celery_heartbeat(client: redis.Redis, *, pid: int) -> None:
    client.set(CELERY_HEARTBEAT_KEY, json.dumps({"at": time.time(), "pid": pid}), ex=CELERY_HEARTBEAT_TTL_S)


def read_celery_heartbeat(client: redis.Redis) -> dict[str, Any] | None:
    raw = client.get(CELERY_HEARTBEAT_KEY)
    return None if raw is None else json.loads(raw)
