"""The expert worker's writes of generation records: one database thread, in the order asked for.

A step's write need not be awaited before the next step computes: every write goes to one thread,
so the records see them in the order the generations asked. The steps of concurrent generations
are coalesced: each generation hands its batch of steps over (`RecordWriter.steps`), and one job on
the thread writes everything handed over since that job was queued in one transaction
(services.generation_steps_many), instead of a transaction per generation per flush. Order still
holds: any other write (a record's creation, its end) closes the open job, so steps handed over
after it go in a job after it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from apps.generation import services
from apps.node.db_threads import with_kept_connections

logger = logging.getLogger("tenzro.generation")


def layer_stats(layer: int, result: dict[str, Any]) -> dict[str, Any]:
    """What a step shows of one MoE layer: its fan-out per holder, its time and what it lost."""
    stats = result["stats"]
    return {"layer": layer, "ms": stats["elapsed_ms"], "dispatch_ms": stats["dispatch_ms"],
            "hedges_fired": stats["hedges_fired"], "hedges_won": stats["hedges_won"],
            "lost_gate_mass": stats["lost_gate_mass"],
            "missing": len(result["missing"]), "failures": len(stats["failures"]),
            "holders": [{"provider": h["provider"], "transport": h["transport"], "rows": h["rows"],
                         "batches": h["batches"], "latency_ms_max": h["latency_ms_max"],
                         "compute_ms": h.get("compute_ms")} for h in stats["holders"] if h["rows"]]}


def _log_failed_write(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.error("could not record a generation step: %s", future.exception())


Batch = list[tuple[str, list[dict[str, Any]], float | None]]  # (generation_id, steps, ttft_ms), in hand-over order


class RecordWriter:
    def __init__(self) -> None:
        self._db = ThreadPoolExecutor(1, thread_name_prefix="generation-db")
        self._lock = threading.Lock()
        self._open: Batch | None = None  # the batch of the queued steps job that still takes hand-overs

    def _queue(self, func: Callable[..., Any], /, **kwargs: Any) -> asyncio.Future:
        future = asyncio.get_running_loop().run_in_executor(self._db, with_kept_connections(lambda: func(**kwargs)))
        future.add_done_callback(_log_failed_write)
        return future

    def write(self, func: Callable[..., Any], /, **kwargs: Any) -> asyncio.Future:
        """Run a service on the database thread, after every write asked for before it."""
        with self._lock:
            # Steps handed over after this write go in a job after it: a generation's first steps must
            # not ride in a job queued before its record's creation (nor its last ones after its end).
            self._open = None
            return self._queue(func, **kwargs)

    def steps(self, *, generation_id: str, steps: list[dict[str, Any]], ttft_ms: float | None = None) -> None:
        """Append `steps` to a generation's record, in one job with the other generations' handed over since
        the last write of any other kind, or since that job started."""
        with self._lock:
            batch, new = self._open, self._open is None
            if new:
                batch = self._open = []
            batch.append((generation_id, steps, ttft_ms))
            if new:
                self._queue(self._write_batch, batch=batch)

    def _write_batch(self, *, batch: Batch) -> None:
        with self._lock:  # taken: later hand-overs open the next job
            if self._open is batch:
                self._open = None
        services.generation_steps_many(batches=batch)
