"""The expert worker's writes of generation records: one database thread, in the order asked for.

A step's write need not be awaited before the next step computes: every write goes to one thread,
so the records see them in the order the generations asked. The steps of concurrent generations
are coalesced: each generation hands its batch of steps over (`RecordWriter.steps`), and one job on
the thread writes everything handed over since the last one in one transaction
(services.generation_steps_many), instead of a transaction per generation per flush. Order still
holds: a generation's later write (its end) is queued after the job that will carry its steps.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections

from apps.generation import services

logger = logging.getLogger("tenzro.generation")


def _log_failed_write(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.error("could not record a generation step: %s", future.exception())


class RecordWriter:
    def __init__(self) -> None:
        self._db = ThreadPoolExecutor(1, thread_name_prefix="generation-db")
        self._lock = threading.Lock()
        self._steps: list[tuple[str, list[dict[str, Any]], float | None]] = []  # handed over, not yet taken

    def write(self, func: Callable[..., Any], /, **kwargs: Any) -> asyncio.Future:
        """Run a service on the database thread, after every write asked for before it."""
        def run() -> Any:
            close_old_connections()
            return func(**kwargs)

        future = asyncio.get_running_loop().run_in_executor(self._db, run)
        future.add_done_callback(_log_failed_write)
        return future

    def steps(self, *, generation_id: str, steps: list[dict[str, Any]], ttft_ms: float | None = None) -> None:
        """Append `steps` to a generation's record with the other generations' pending ones."""
        with self._lock:
            first = not self._steps
            self._steps.append((generation_id, steps, ttft_ms))
        if first:  # the job not yet started takes these too; once it has taken them, the next hand-over queues one
            self.write(self._write_pending)

    def _write_pending(self) -> None:
        with self._lock:
            batches, self._steps = self._steps, []
        services.generation_steps_many(batches=batches)
