"""Reads about this node: identity, endpoints, roles, process liveness."""

from __future__ import annotations

import socket
import time
from functools import cache
from typing import Any

import redis
from django.conf import settings

from apps.node import liveness
from apps.node.identity import NodeIdentity, load_or_create_identity


@cache
def node_identity() -> NodeIdentity:
    return load_or_create_identity(settings.TENZRO_DATA_DIR)


@cache
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def redis_check() -> dict[str, Any]:
    """Does this node's Redis (broker, Channels layer, web↔worker mailboxes) answer a PING now? {ok, error}."""
    try:
        redis_client().ping()
    except redis.RedisError as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True, "error": None}


def own_name(provider_id: str) -> str:
    """This node's name for people: TENZRO_NODE_NAME, else "<host name>-<first 6 hex of its id>" (the
    suffix tells apart several nodes on one host)."""
    if settings.TENZRO_NODE_NAME:
        return settings.TENZRO_NODE_NAME
    host = "".join(c for c in socket.gethostname().split(".")[0] if c.isprintable() and not c.isspace())
    return f"{host[:57] or 'node'}-{provider_id[:6]}"  # 64 characters at most, as a record's name


def node_info() -> dict[str, Any]:
    identity = node_identity()
    return {
        "provider_id": identity.provider_id,
        "name": own_name(identity.provider_id),
        "roles": list(settings.TENZRO_ROLES),
        "version": settings.TENZRO_VERSION,
        "endpoints": {
            "http": settings.TENZRO_PUBLIC_HTTP,
            "quic": settings.TENZRO_QUIC,
            "quic_cert_sha256": identity.cert_sha256,
        },
        "peers": list(settings.TENZRO_PEERS),
    }


def node_processes() -> dict[str, Any]:
    """What the supervisor last wrote about each process, plus the Celery heartbeat.

    A node started without the supervisor (e.g. `manage.py runserver`) has no record;
    that reads as `supervised: false` rather than as an error.
    """
    try:
        client = redis_client()
        record = liveness.read_processes(client)
        heartbeat = liveness.read_celery_heartbeat(client)
    except redis.RedisError as exc:
        return {"supervised": False, "processes": [], "celery_heartbeat_age_s": None, "error": str(exc)}
    now = time.time()
    return {
        "supervised": record is not None,
        "processes": [] if record is None else record["processes"],
        "celery_heartbeat_age_s": None if heartbeat is None else round(now - heartbeat["at"], 1),
    }
