"""An event loop that outlives the calls made on it, for synchronous code that keeps connections.

A Celery task is synchronous; `asyncio.run` in it makes a new loop per call, and whatever the
call opened (a QuicPool's connections) must be closed with that loop. A `LoopThread` runs one
loop in a daemon thread of its own for the life of the process, so a pool made on it keeps its
connections from one call to the next (the gossip round: apps/providers/rounds.py).

A process forked from the one that started the thread (Celery's prefork pool) has the object but
not the thread: the first call in the child starts a loop of the child's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """One event loop in a daemon thread, started on first use; `run` waits for a coroutine on it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop of this process, started if there is none (or it was the parent's)."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or not self._thread or not self._thread.is_alive():
                ready = threading.Event()
                loop = asyncio.new_event_loop()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T], *, timeout_s: float) -> T:
        """The coroutine's result, run on this thread's loop. TimeoutError past `timeout_s` (the
        coroutine is cancelled); RuntimeError when called from the loop's own thread (it would wait
        for itself)."""
        if threading.current_thread() is self._thread and self._pid == os.getpid():
            coroutine.close()
            raise RuntimeError(f"LoopThread {self._name}: run() called from its own loop")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop())
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise TimeoutError(f"{self._name}: not done within {timeout_s:g} s") from exc

    def stop(self) -> None:
        """Stop the loop and wait for its thread (tests; a process that exits needs nothing)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None and self._pid == os.getpid():
            # Its tasks end as asyncio.run ends them (cancelled, then awaited), not destroyed pending:
            # a connection waiting out its closing period still closes its socket.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()


async def _cancel_pending() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
