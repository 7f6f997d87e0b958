"""Events a worker method streams back to the web process that asked for them, as they happen.

The web process names a stream (`new_stream`), passes the name in the call's params, and reads it
(`stream_events`); the worker appends each event (`EventStream`) to the stream's mailbox
(apps/worker/mailbox.py). Events leave in the order they were put, from one sender task per stream,
so a slow Redis write never holds up the caller's next step; events nobody reads (the reader left)
expire with their mailbox.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import RedisError

from apps.worker import mailbox
from core.errors import Unavailable

logger = logging.getLogger("tenzro.worker")
STREAM_PREFIX = "tenzro:stream:"
_END = object()


def stream_key(name: str) -> str:
    return STREAM_PREFIX + name


class EventStream:
    """The worker's side: `put` lets the event leave at once; `close` waits until every event put has left."""

    def __init__(self, name: str | None) -> None:
        self.name = name
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.create_task(self._send()) if name else None

    async def put(self, event: dict[str, Any]) -> None:
        """Queue the event and give the sender its turn now: it writes the event to Redis before the
        caller's next step starts computing (a compute thread holding the GIL would keep this loop from
        sending for up to a switch interval, 5 ms)."""
        if self._task is not None:
            self._queue.put_nowait(event)
            await asyncio.sleep(0)

    async def close(self) -> None:
        if self._task is None:
            return
        self._queue.put_nowait(_END)
        await asyncio.shield(self._task)

    async def _send(self) -> None:
        key, ended = stream_key(self.name or ""), False
        while not ended:
            batch = [await self._queue.get()]
            while not self._queue.empty():  # what queued while Redis answered leaves in one write
                batch.append(self._queue.get_nowait())
            if batch[-1] is _END:
                batch.pop()
                ended = True
            if not batch:
                continue
            try:
                await mailbox.post(key, *batch)
            except (RedisError, OSError) as exc:  # the reader sees the stream stall and gives up; the work goes on
                logger.warning("could not stream %d events to %s: %s", len(batch), self.name, exc)


def new_stream() -> str:
    """The web process's side: a fresh stream's name, for a worker to stream into."""
    return uuid.uuid4().hex


async def stream_events(name: str, *, idle_timeout_s: float) -> AsyncIterator[dict[str, Any]]:
    """The events a worker streams into `name`, until one of type "end" (included); Unavailable when
    none arrives for idle_timeout_s."""
    key = stream_key(name)
    while True:
        try:
            event = await mailbox.take(key, idle_timeout_s)
        except (RedisError, OSError) as exc:
            raise Unavailable(f"the stream from the expert worker broke: {type(exc).__name__}: {exc}",
                              reason="redis_unavailable") from exc
        if event is None:
            raise Unavailable(f"the expert worker sent nothing for {idle_timeout_s} s", reason="worker_unavailable")
        yield event
        if event.get("type") == "end":
            return
