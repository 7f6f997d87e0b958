"""Keeps the control plane's copy of the worker state equal to the runtime's.

The runtime reports every change (load, unload, promotion, eviction) through `changed()`,
from whichever thread made it. One publish loop turns bursts of changes into one write: a
forward that promotes twenty experts costs one publish, not twenty. `flush()` waits until a
publish that started after the call has finished; a load awaits it before answering, so a
read of the control plane after the answer sees the new holding. Between changes the loop
heartbeats, refreshing the node-wide figures (committed_tps, memory used) and the liveness
stamp that readers use to mark a silent worker's state stale.

The writes are plain callables (Django services in the worker) run on one dedicated
thread, so publishes never overlap and never block the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

logger = logging.getLogger(__name__)

Status = dict[str, Any]


class StatePublisher:
    def __init__(
        self,
        *,
        snapshot: Callable[[], Status],
        publish: Callable[[Status], Any],
        heartbeat: Callable[[Status], Any],
        heartbeat_s: float,
        coalesce_s: float = 0.05,
        retry_s: float = 1.0,
    ) -> None:
        self._snapshot = snapshot
        self._publish = publish
        self._heartbeat = heartbeat
        self._heartbeat_s = heartbeat_s
        self._coalesce_s = coalesce_s
        self._retry_s = retry_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publisher")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._published = asyncio.Condition()
        self._requested = 0  # changes seen so far
        self._covered = 0  # changes the last finished publish included
        self.publishes = 0
        self.failures = 0

    def changed(self) -> None:
        """Something the worker advertises changed. Thread-safe, cheap, never raises."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._request)

    def _request(self) -> int:
        self._requested += 1
        self._wake.set()
        return self._requested

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Publish now and wait for it; False (logged) if the control plane did not take it in time."""
        target = self._request()
        try:
            async with asyncio.timeout(timeout_s), self._published:
                await self._published.wait_for(lambda: self._covered >= target)
        except TimeoutError:
            logger.error("the worker state was not published within %.0f s; readers see the previous state",
                         timeout_s)
            return False
        return True

    async def _run_sync(self, func: Callable[..., Any], *args: Any) -> Any:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._executor, func, *args)

    async def run(self) -> None:
        """The publish loop; publishes once at start (a full sync with what a previous run left)."""
        self._loop = asyncio.get_running_loop()
        self._request()
        while True:
            try:  # asyncio.timeout, not wait_for: on Python 3.11 that can drop the stop's cancel (mailbox.py)
                async with asyncio.timeout(self._heartbeat_s):
                    await self._wake.wait()
            except TimeoutError:
                await self._beat()
                continue
            self._wake.clear()
            target = self._requested
            try:
                await self._run_sync(lambda: self._publish(self._snapshot()))
            except Exception:
                self.failures += 1
                logger.exception("could not publish the worker state; retrying in %.1f s", self._retry_s)
                await asyncio.sleep(self._retry_s)
                self._wake.set()
                continue
            self.publishes += 1
            async with self._published:
                self._covered = max(self._covered, target)
                self._published.notify_all()
            await asyncio.sleep(self._coalesce_s)

    async def _beat(self) -> None:
        try:
            await self._run_sync(lambda: self._heartbeat(self._snapshot()))
        except Exception:
            self.failures += 1
            logger.exception("worker heartbeat to the control plane failed")

    async def close(self, final: Callable[[], Any] | None = None) -> None:
        """Run `final` (e.g. mark the state stopped) on the publish thread, then stop it."""
        if final is not None:
            try:
                await self._run_sync(final)
            except Exception:
                logger.exception("could not record the worker's stop in the control plane")
        self._executor.shutdown(wait=False, cancel_futures=True)
