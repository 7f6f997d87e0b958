"""One asyncio Redis client per event loop, kept across requests (a new connection costs ~5 ms).

A client's connections belong to the loop that made them, so each loop (the web process's, the expert
worker's, a test's) gets its own."""

from __future__ import annotations

import asyncio
import weakref

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError

# Longer than any blocking read made with it (apps/worker/mailbox.py blocks at most TAKE_POLL_S a read).
SOCKET_TIMEOUT_S = 5.0
# Keyed by the loop itself, weakly: a closed loop's id may be reused by a new one.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = weakref.WeakKeyDictionary()


def loop_redis() -> aioredis.Redis:
    """This event loop's client of the node's Redis (REDIS_URL)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        # After a Redis restart every pooled connection is dead: one retry on a fresh one hides it.
        client = _clients[loop] = aioredis.from_url(settings.REDIS_URL, socket_timeout=SOCKET_TIMEOUT_S,
                                                    retry_on_error=[RedisConnectionError])
    return client
