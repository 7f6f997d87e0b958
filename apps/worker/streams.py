"""Events a worker method streams back to the web process that asked for them, as they happen.

The web process makes a channel on the Channels layer (its `new_channel()`), names it in the call's
params, and reads it; the worker sends each event there. Events leave in the order they were put,
from one sender task per stream, so a slow Redis write never holds up the caller's next step, and an
event the reader will never read (it left) expires with the channel (the layer's expiry).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from channels.layers import get_channel_layer
from redis.exceptions import RedisError

from core.errors import Unavailable

logger = logging.getLogger("tenzro.worker")
_END = object()


class EventStream:
    """The worker's side: `put` never waits; `close` waits until every event put has left."""

    def __init__(self, channel: str | None) -> None:
        self.channel = channel
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.create_task(self._send()) if channel else None

    def put(self, event: dict[str, Any]) -> None:
        if self._task is not None:
            self._queue.put_nowait(event)

    async def close(self) -> None:
        if self._task is None:
            return
        self._queue.put_nowait(_END)
        await asyncio.shield(self._task)

    async def _send(self) -> None:
        layer = get_channel_layer()
        while (event := await self._queue.get()) is not _END:
            try:
                await layer.send(self.channel, event)
            except (RedisError, OSError) as exc:  # the reader sees the stream stall and gives up; the work goes on
                logger.warning("could not stream an event to %s: %s", self.channel, exc)


async def new_stream() -> str:
    """The web process's side: a channel for a worker to stream into."""
    try:
        return await get_channel_layer().new_channel()
    except (RedisError, OSError) as exc:
        raise Unavailable(f"cannot open a stream from the expert worker: Redis (the Channels layer) does not "
                          f"answer ({type(exc).__name__}: {exc})", reason="redis_unavailable") from exc


async def stream_events(channel: str, *, idle_timeout_s: float) -> AsyncIterator[dict[str, Any]]:
    """The events a worker streams into `channel`, until one of type "end" (included); Unavailable when
    none arrives for idle_timeout_s."""
    layer = get_channel_layer()
    while True:
        try:
            event = await asyncio.wait_for(layer.receive(channel), idle_timeout_s)
        except TimeoutError as exc:
            raise Unavailable(f"the expert worker sent nothing for {idle_timeout_s} s", reason="worker_unavailable") \
                from exc
        except (RedisError, OSError) as exc:
            raise Unavailable(f"the stream from the expert worker broke: {type(exc).__name__}: {exc}",
                              reason="redis_unavailable") from exc
        yield event
        if event.get("type") == "end":
            return
