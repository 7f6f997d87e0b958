"""Mailboxes between this node's web process and its expert worker: Redis lists of msgpack messages.

The operator door's calls, their answers, and a generation's events travel this way (apps/worker/
client.py, server.py, streams.py; docs/architecture.md, "The operator door"). Posting is one round
trip (RPUSH and EXPIRE, pipelined) and taking is one blocking pop, where the Channels layer's send
is four round trips, each one a wake-up of an event loop that a compute thread may be holding
through the GIL. A mailbox expires MAILBOX_EXPIRY_S after its last message, so what nobody takes
(its reader left, or the worker is down) goes away by itself.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack

from apps.api.loop_redis import loop_redis

MAILBOX_EXPIRY_S = 60
TAKE_POLL_S = 1.0  # one blocking pop at most this long (less than the client's socket timeout)


def pack(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


async def post(key: str, *messages: dict[str, Any]) -> None:
    """Append messages to the mailbox `key`, in order; RedisError/OSError when Redis does not answer."""
    async with loop_redis().pipeline(transaction=False) as pipe:
        await pipe.rpush(key, *(pack(m) for m in messages)).expire(key, MAILBOX_EXPIRY_S).execute()


async def take(key: str, timeout_s: float) -> dict[str, Any] | None:
    """The mailbox's next message, waiting up to timeout_s (None when none came)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        popped = await loop_redis().blpop([key], timeout=min(TAKE_POLL_S, max(left, 0.01)))
        if popped is not None:
            return msgpack.unpackb(popped[1], raw=False)
