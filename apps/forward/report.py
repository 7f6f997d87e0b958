"""What a layer forward reports: each holder's answers, failures and statistics.

Pure data (no Django, no I/O), shared by the dispatch (apps/forward/engine.py), the callers that
produce answers (apps/forward/callers.py) and the ledger that writes a generation's outcome.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Below this many bytes of requests and answers, a holder's time beyond its round trip and compute is
# mostly fixed costs (framing, the receipt, a wake-up), not time per byte: a decode step's 16 KiB would
# read as a path several times narrower than it is.
WIRE_SAMPLE_MIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class Answer:
    """A holder's answer: rows f32 [n, d_model], and what crossed the wire (0 for local)."""

    rows: np.ndarray
    bytes_sent: int = 0
    bytes_received: int = 0
    transport: str = "local"  # local | quic | http
    compute_s: float | None = None  # the holder's own time on the batch, when it says
    receipt: Any = None  # the holder's verified receipt (apps.forward.callers.VerifiedBatch); None for local
    request: int | None = None  # the request it shared with other batches (one latency sample for them all)
    rtt_s: float | None = None  # the smoothed RTT of the QUIC connection it came over: the path's round trip


@dataclass(frozen=True)
class Failure:
    """A holder that failed one batch: `reason` is the error's (timeout, connection_failed,
    expert_not_loaded, …) or `stalled` for a primary raced out by its backup; `answering`: a stalled
    one's connection had received datagrams since the request went out (slow, not hung)."""

    provider: str
    reason: str
    message: str
    layer: int
    expert: int
    rows: int
    answering: bool = False


@dataclass
class HolderStats:
    provider: str
    transport: str = ""
    batches: int = 0
    rows: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    latencies_s: list[float] = field(default_factory=list)
    overheads_s: list[float] = field(default_factory=list)  # per request: its latency less its compute (the wire's)
    computes_s: list[float] = field(default_factory=list)  # the compute each answer reported (compute_ms)
    rtts_s: list[float] = field(default_factory=list)  # the path's round trip as each QUIC answer found it
    failures: int = 0
    receipts: list[Any] = field(default_factory=list)  # the verified receipts of the batches it won
    lanes: set[int] = field(default_factory=set)  # the connection lanes its requests' answers came over

    def credit(self, answer: Answer, n: int, elapsed: float, *, overhead: bool = True) -> None:
        """A batch of n rows this holder won in `elapsed` seconds (`overhead`: the batch was a request of
        its own, so its time less its compute is the wire's share)."""
        self.transport = answer.transport
        self.batches += 1
        self.rows += n
        self.bytes_sent += answer.bytes_sent
        self.bytes_received += answer.bytes_received
        self.latencies_s.append(elapsed)
        if answer.receipt is not None:
            self.receipts.append(answer.receipt)
        if answer.compute_s is not None:
            if overhead:
                self.overheads_s.append(max(0.0, elapsed - answer.compute_s))
            self.computes_s.append(answer.compute_s)
        if answer.rtt_s is not None:
            self.rtts_s.append(answer.rtt_s)

    def wire_ns_per_byte(self) -> float | None:
        """The time its slowest request took beyond its path's round trip and its compute, per byte of its
        requests and answers (ns): the path's throughput, inverted, that the planner weighs its rows by.
        None where this forward says little of it: under WIRE_SAMPLE_MIN_BYTES, or no QUIC round trip
        or no compute to take away."""
        moved = self.bytes_sent + self.bytes_received
        if moved < WIRE_SAMPLE_MIN_BYTES or not self.rtts_s or not self.overheads_s:
            return None
        return max(0.0, max(self.overheads_s) - statistics.median(self.rtts_s)) * 1e9 / moved

    def to_dict(self) -> dict[str, object]:
        # statistics, not numpy: a decode step's holder has a sample or a few, where numpy's call
        # overhead is most of the cost (this runs for every holder of every MoE layer)
        lat = self.latencies_s
        return {"provider": self.provider, "transport": self.transport, "batches": self.batches, "rows": self.rows,
                "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received, "failures": self.failures,
                "latency_ms_median": round(statistics.median(lat) * 1000.0, 3) if lat else None,
                "latency_ms_max": round(max(lat) * 1000.0, 3) if lat else None,
                "overhead_ms_median": round(statistics.median(self.overheads_s) * 1000.0, 3)
                if self.overheads_s else None,
                "compute_ms": round(sum(self.computes_s) * 1000.0, 3) if self.computes_s else None,
                "rtt_ms": round(statistics.median(self.rtts_s) * 1000.0, 3) if self.rtts_s else None,
                "wire_ns_per_byte": None if (wire := self.wire_ns_per_byte()) is None else round(wire, 3),
                "receipts": len(self.receipts), "lanes": len(self.lanes) or (1 if self.batches else 0)}


@dataclass
class ForwardReport:
    holders: dict[str, HolderStats] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    hedges_fired: int = 0
    hedges_won: int = 0
    retries: int = 0
    replans: int = 0
    batches: int = 0
    unroutable: list[tuple[int, int, int, str]] = field(default_factory=list)
    timed_requests: set[int] = field(default_factory=set)  # gathered requests whose latency the book has
    censored: set[str] = field(default_factory=set)  # holders raced out while answering, whose book has a sample

    def holder(self, provider: str) -> HolderStats:
        return self.holders.setdefault(provider, HolderStats(provider))

    @property
    def failed_providers(self) -> frozenset[str]:
        return frozenset(f.provider for f in self.failures if f.reason != "stalled")

    def cooling_providers(self) -> frozenset[str]:
        """The holders to plan last for a while (the forward failure cooldown): each that failed, and
        each that stalled silent (not a datagram back since its request went out) without answering any
        of the forward's batches, as a hung holder does. Not one that answered some and stalled on
        others: on a lossy path a request's lost last datagram waits out a probe timeout. Nor one that
        stalled while its connection still answered: when a path's round trip jumps, every request to
        it runs past the quantile its book learnt on the old path. Cooled, either gave every row of the
        next forwards to the other holder."""
        answering = {f.provider for f in self.failures if f.reason == "stalled" and f.answering}
        return self.failed_providers | frozenset(
            f.provider for f in self.failures
            if f.reason == "stalled" and f.provider not in answering
            and not getattr(self.holders.get(f.provider), "batches", 0))
