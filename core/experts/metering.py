"""Rolling-minute meters of expert-forward work: capacity (ThroughputMeter) and demand (DemandMeter).

docs/specification.md, "Metering", keeps two numbers apart. Capacity, `capacity_tps`, is

    rows executed in the last 60 s / seconds spent computing those rows

aggregated over every expert on the node. Dividing by compute time rather than wall time
measures what the node can sustain, not what it was asked: a node that served 10 rows in a
quiet minute still reports the rate it can sustain. The planner ranks holders by it. Demand,
`committed_tps`, is per expert: rows served in the last 60 s / 60 s of wall time; repair
raises an expert's replication by it. Rows are
tokens entering an expert forward (one token routed to k local experts counts k times,
which is what a dispatch planner sends). The time is the expert forward itself (matmuls
and activation), excluding disk promotion and queueing, so a cold first call does not
understate capacity. When the last minute holds no work the last measured value is held,
so an idle holder keeps advertising what it last proved rather than dropping to zero
(demand, by contrast, falls to zero a minute after the last row).

Pure and clock-injectable (`now` in seconds, monotonic) so tests need no sleeps.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable

WINDOW_S = 60.0


class ThroughputMeter:
    """Thread-safe; memory is bounded by one bucket per second of the window."""

    def __init__(self, *, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._buckets: deque[list[float]] = deque()  # [second, rows, compute_seconds], oldest first
        self._held = 0.0
        self._lock = threading.Lock()

    def record(self, rows: int, seconds: float, *, now: float | None = None) -> None:
        """Count `rows` executed in `seconds` of compute, finishing at `now`."""
        now = time.monotonic() if now is None else now
        second = float(int(now))
        with self._lock:
            if self._buckets and self._buckets[-1][0] == second:
                self._buckets[-1][1] += rows
                self._buckets[-1][2] += seconds
            else:
                self._buckets.append([second, float(rows), seconds])
            self._expire(now)

    def rows_per_second(self, *, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._expire(now)
            rows = sum(b[1] for b in self._buckets)
            seconds = sum(b[2] for b in self._buckets)
            if rows and seconds > 0:
                self._held = rows / seconds
            return self._held

    def _expire(self, now: float) -> None:
        # a bucket covers [second, second+1); drop it once it is wholly older than the window
        cutoff = now - self.window_s
        if self._buckets and self._buckets[-1][0] + 1.0 <= cutoff:
            # the whole window is about to empty: remember its rate first (the held value)
            rows = sum(b[1] for b in self._buckets)
            seconds = sum(b[2] for b in self._buckets)
            if rows and seconds > 0:
                self._held = rows / seconds
            self._buckets.clear()
        while self._buckets and self._buckets[0][0] + 1.0 <= cutoff:
            self._buckets.popleft()


class DemandMeter:
    """Rows served per expert per second of wall time over the window; thread-safe.

    Memory is bounded by one bucket per second of the window per expert that served rows in it.
    """

    def __init__(self, *, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._buckets: dict[Hashable, deque[list[float]]] = {}  # key -> [second, rows], oldest first
        self._lock = threading.Lock()

    def record(self, key: Hashable, rows: int, *, now: float | None = None) -> None:
        """Count `rows` served for `key` at `now`."""
        self.record_many([(key, rows)], now=now)

    def record_many(self, served: list[tuple[Hashable, int]], *, now: float | None = None) -> None:
        """record() of each (key, rows) at one `now` (a multi-expert request's experts), under one lock."""
        now = time.monotonic() if now is None else now
        second = float(int(now))
        with self._lock:
            for key, rows in served:
                buckets = self._buckets.setdefault(key, deque())
                if buckets and buckets[-1][0] == second:
                    buckets[-1][1] += rows
                else:
                    buckets.append([second, float(rows)])

    def rates(self, *, now: float | None = None) -> dict[Hashable, float]:
        """{key: rows per second over the window} for every key that served rows in it."""
        now = time.monotonic() if now is None else now
        cutoff = now - self.window_s
        out: dict[Hashable, float] = {}
        with self._lock:
            for key in list(self._buckets):
                buckets = self._buckets[key]
                while buckets and buckets[0][0] + 1.0 <= cutoff:
                    buckets.popleft()
                if not buckets:
                    del self._buckets[key]
                    continue
                out[key] = sum(b[1] for b in buckets) / self.window_s
        return out
