"""Mailboxes between this node's web process and its expert worker: Redis lists of msgpack messages.

The operator door's calls, their answers, and a generation's events travel this way (apps/worker/
client.py, server.py, streams.py; docs/architecture.md, "The operator door"). Posting is one round
trip (RPUSH and EXPIRE, pipelined) and taking is one blocking pop, where the Channels layer's send
is four round trips, each one a wake-up of an event loop that a compute thread may be holding
through the GIL. A mailbox expires MAILBOX_EXPIRY_S after its last message, so what nobody takes
(its reader left, or the worker is down) goes away by itself.
"""

from __future__ import annotations

import asyncio
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
    """The mailbox's next message, waiting up to timeout_s (None when none came); CancelledError at the
    next poll when this task was cancelled, also where an await swallowed the cancel."""
    deadline = time.monotonic() + timeout_s
    while True:
        _raise_if_cancelled()
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        popped = await loop_redis().blpop([key], timeout=min(TAKE_POLL_S, max(left, 0.01)))
        if popped is not None:
            return msgpack.unpackb(popped[1], raw=False)


def _raise_if_cancelled() -> None:
    """End a cancelled task's wait, though the CancelledError never reached it.

    Python 3.11's asyncio.wait_for, which redis-py's every command awaits, returns its future's result
    and drops the cancel when the two land together (CPython gh-86296; fixed in 3.12). The cancel's
    count stays on the task. A /v1 stream whose client left then read on to the generation's end:
    1-3 % of cancels of a waiting BLPOP were lost, and the e2e test of a client leaving failed 3 runs
    in 13 on a loaded 2-core host."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
