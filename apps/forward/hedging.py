"""When to race a batch's backup holder: per-holder latency by batch size (adaptive hedging).

Pure module (no Django, no I/O, no clock: callers pass seconds). The forward races a warm
backup against a primary that stalls, and "stalls" means: has taken longer than that
holder's own high-percentile latency for batches of similar size — not a fixed delay, which
is either too short for a big batch (every batch hedged, twice the work) or too long for a
small one (a hung holder costs seconds). As in "The Tail at Scale" (Dean and Barroso, 2013),
deferring the second request to the p95 bounds the extra load at about 5% of requests.

Similar size: batches are bucketed by powers of two of their row count. A hedge fires only past
the holder's *own* quantile for that size, once it has `min_samples` there: other holders'
latencies say little of this one's (another machine, another load), and hedging on them fired
on 8-18 % of batches and mostly lost. Until then no hedge (`default_s` None, the default: the
attempt timeout bounds a holder that hangs before it was ever measured), or a hedge after
`default_s` when an operator sets one. `floor_s` keeps loopback jitter from hedging
sub-millisecond batches. The quantile is an operator setting (TENZRO_FORWARD_HEDGE_QUANTILE,
0.99 by default: a request past its own p99 is rarely merely slow, so the backup usually wins
and the extra load stays near 1 %).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HedgePolicy:
    quantile: float = 0.95
    min_samples: int = 16
    window: int = 64  # most recent samples kept per (holder, bucket)
    floor_s: float = 0.002
    default_s: float | None = None


def linear_quantile(ascending: list[float], q: float) -> float:
    """np.quantile(ascending, q) (its default, linear method), bit for bit, over a short sorted list:
    numpy's call costs ~25 µs whatever the size, and the forward asks once per holder per layer."""
    position = q * (len(ascending) - 1)
    below = int(position)  # floor: position >= 0
    above = min(below + 1, len(ascending) - 1)
    a, b, t = ascending[below], ascending[above], position - below
    # numpy's lerp: from the nearer end, so that t = 1 gives b exactly
    return b - (b - a) * (1.0 - t) if t >= 0.5 else a + (b - a) * t


def size_bucket(rows: int) -> int:
    """0 for 0-1 rows, then floor(log2(rows)) + 1: 2-3 -> 2, 4-7 -> 3, …"""
    return max(int(rows), 0).bit_length()


class LatencyBook:
    """Recent latencies per (holder, size bucket), and the hedge delay they imply."""

    def __init__(self, policy: HedgePolicy | None = None) -> None:
        self.policy = policy or HedgePolicy()
        self._samples: dict[tuple[str, int], deque[float]] = {}

    def record(self, holder: str, rows: int, seconds: float) -> None:
        """A batch of `rows` answered by `holder` after `seconds`: winners, and once per forward a
        raced-out attempt whose connection was still answering, with its time so far (a lower bound;
        apps/forward/engine.py). Not a hung one's: its time says nothing of the holder's speed."""
        bucket = size_bucket(rows)
        window = self.policy.window
        self._samples.setdefault((holder, bucket), deque(maxlen=window)).append(seconds)

    def _quantile(self, samples: deque[float] | None) -> float | None:
        if samples is None or len(samples) < self.policy.min_samples:
            return None
        return linear_quantile(sorted(samples), self.policy.quantile)

    def hedge_after_s(self, holder: str, rows: int) -> float | None:
        """Seconds after which a batch of `rows` on `holder` counts as stalled: its own measured quantile
        at that size, else the default; None: not hedged (no measurements, no default)."""
        own = self._quantile(self._samples.get((holder, size_bucket(rows))))
        if own is None:
            own = self.policy.default_s
        return None if own is None else max(self.policy.floor_s, own)

    def median_s(self, holder: str) -> float | None:
        """The holder's median over every bucket it has samples in (for ranking), None if none."""
        samples = [s for (h, _), q in self._samples.items() if h == holder for s in q]
        return float(np.median(samples)) if samples else None
