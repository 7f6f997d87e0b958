"""Telling random loss and reordering from congestion: the sans-I/O half of the tolerant controller.

A loss-based controller (NewReno, CUBIC) reads every lost datagram as a full queue and halves
its window; on a path that drops 1 % of datagrams at random, or that reorders 1 % of them, the
window then never grows past a few dozen datagrams and a 0.5 MB answer takes a second at 30 ms
RTT (docs/performance.md, "Loss and reordering on the wire"). Two signals tell the cases apart:

* **Reordering is not loss.** QUIC declares a packet lost once 3 later packets are acknowledged,
  or once it is 9/8 RTT old while a later one was acknowledged (RFC 9002 6.1). A datagram that
  overtakes the queue makes every packet it overtook "lost" both ways (and its own short RTT
  sample shrinks the time threshold). When a packet declared lost is acknowledged after all,
  the loss was spurious, and the threshold that declared it grows (RFC 9002 allows adaptive
  thresholds; Linux's RACK widens its reordering window the same way).
* **Loss is congestion when the queue grew or loss is heavy.** A full drop-tail queue shows as
  RTTs above the lowest they have been; random loss on an idle path does not. (The median of
  the recent samples, not their minimum: a reordered datagram that skipped the queue gives a sample
  far below the path's, and jitter or a busy peer move only some samples.) A loss event is
  congestion when that recent RTT exceeds its base by a fraction of it (and a floor), or when
  more than `heavy_loss` of the bytes sent lately were lost for at least an RTT (a shallow
  buffer that drops before the delay shows); losses later found spurious are taken back.
  Otherwise the window is kept.

Both are plain state machines fed by the QUIC library's recovery (core/transport/quic_tolerant.py
adapts aioquic's); they import no QUIC library.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

# RFC 9002 6.1.1 and 6.1.2: the packet threshold (below 3 is not recommended) and the time threshold.
MIN_PACKET_THRESHOLD = 3
TIME_THRESHOLD = 9 / 8


@dataclass
class ReorderingTolerance:
    """Loss detection's thresholds, raised when a packet declared lost is acknowledged after all.

    A packet is declared lost when `packet_threshold` later packets are acknowledged, or when it
    is older than `time_factor` RTTs while a later one was acknowledged (RFC 9002 6.1: 3 and 9/8).
    `declared_lost` records each declaration (the packet's size, whether the time or the count
    declared it, and the largest acknowledged packet number then); `acknowledged` takes an ACK
    frame's ranges and answers the bytes of the recorded packets it acknowledges (spurious
    losses). Each spurious loss raises the packet threshold to the reordering distance it showed
    plus one (up to `max_packet_threshold`); an ACK that shows time-declared losses spurious
    raises the time factor by `time_step` (up to `max_time_factor`, as Linux's RACK widens its
    reordering window to at most one RTT). At most `remembered` declarations are kept.
    """

    max_packet_threshold: int = 1024
    max_time_factor: float = 2.0
    time_step: float = 0.25
    remembered: int = 4096
    packet_threshold: int = MIN_PACKET_THRESHOLD
    time_factor: float = TIME_THRESHOLD
    spurious: int = 0  # packets declared lost and acknowledged after all, over the connection
    _numbers: list[int] = field(default_factory=list)  # sorted packet numbers declared lost
    # packet number -> (largest acknowledged then, bytes, declared by time)
    _declared: dict[int, tuple[int, int, bool]] = field(default_factory=dict)

    def declared_lost(self, packet_number: int, *, largest_acked: int, size: int, by_time: bool) -> None:
        if packet_number in self._declared:
            return
        bisect.insort(self._numbers, packet_number)
        self._declared[packet_number] = (largest_acked, size, by_time)
        if len(self._numbers) > self.remembered:
            del self._declared[self._numbers.pop(0)]

    def acknowledged(self, ranges: Iterable[range]) -> int:
        """Bytes of spurious losses among the acknowledged `ranges` (packet-number ranges, stop exclusive)."""
        found, late = 0, False
        for acked in ranges:
            start = bisect.bisect_left(self._numbers, acked.start)
            stop = bisect.bisect_left(self._numbers, acked.stop)
            for number in self._numbers[start:stop]:
                largest_then, size, by_time = self._declared.pop(number)
                if by_time:
                    late = True
                else:
                    self.packet_threshold = min(self.max_packet_threshold,
                                                max(self.packet_threshold, largest_then - number + 1))
                self.spurious += 1
                found += size
            del self._numbers[start:stop]
        if late:
            self.time_factor = min(self.max_time_factor, self.time_factor + self.time_step)
        return found


@dataclass
class CongestionSignal:
    """Whether a loss event is congestion: the queue grew (delay) or the loss is heavy (rate).

    `rtt_sample` takes each RTT sample (the peer's ACK delay taken out); `acked`/`lost` take
    the bytes of each packet acknowledged or declared lost.

    The queue is read from the median of the last `window` samples, against the lowest that
    median has been over the last `base_window_s`: a standing queue raises every sample, where
    jitter, a busy peer's late ACKs (its event loop computing, on a small machine) and a
    reordered datagram's short sample move only some; and a route whose delay grew is a new
    base within that window (as BBR expires its min_rtt), not a queue for ever.

    The loss rate is measured over the last `horizon_bytes` or so (the counts halve whenever
    they pass it) and judged only once half a horizon has been seen: at 1 %
    random loss, a handful of datagrams would read as 5 % by chance.
    """

    queue_fraction: float = 0.5  # the recent RTT this far above its base (as a fraction of it) ...
    queue_floor_s: float = 0.005  # ... and at least this far above: a queue, not noise
    heavy_loss: float = 0.05  # fraction of bytes lost lately above which loss is congestion
    horizon_bytes: int = 256 * 1_350  # the loss rate's memory: a few hundred datagrams
    window: int = 32  # RTT samples the queue estimate reads
    quantile: float = 0.5  # the median: reordered datagrams and ACKs (1-2 % of samples) stay below it
    base_window_s: float = 10.0
    recent_rtt_s: float | None = None  # the `quantile` of the last `window` samples
    _samples: deque[float] = field(default_factory=deque)
    _lows: deque[tuple[float, float]] = field(default_factory=deque)  # (time, recent RTT), rising: a sliding minimum
    _acked_bytes: float = 0.0
    _lost_bytes: float = 0.0
    _heavy_since: float | None = None  # when heavy loss was first seen, not yet confirmed

    def rtt_sample(self, sample_s: float, now: float) -> None:
        """One RTT sample (seconds) taken at `now` (seconds, any monotonic origin)."""
        self._samples.append(sample_s)
        if len(self._samples) > self.window:
            self._samples.popleft()
        if len(self._samples) < self.window // 2:
            return  # too few to tell a queue from noise
        ordered = sorted(self._samples)
        recent = self.recent_rtt_s = ordered[int(self.quantile * (len(ordered) - 1))]
        while self._lows and self._lows[-1][1] >= recent:
            self._lows.pop()
        self._lows.append((now, recent))
        while self._lows[0][0] < now - self.base_window_s:
            self._lows.popleft()

    @property
    def base_rtt_s(self) -> float:
        """The lowest recent RTT of the last `base_window_s` (inf before enough samples)."""
        return self._lows[0][1] if self._lows else float("inf")

    def acked(self, size: int) -> None:
        self._acked_bytes += size
        self._age()

    def lost(self, size: int) -> None:
        self._lost_bytes += size
        self._age()

    def not_lost(self, size: int) -> None:
        """Bytes declared lost that were acknowledged after all (reordered, not dropped)."""
        moved = min(size, self._lost_bytes)
        self._lost_bytes -= moved
        self._acked_bytes += moved

    def _age(self) -> None:
        if self._acked_bytes + self._lost_bytes > self.horizon_bytes:
            self._acked_bytes *= 0.5
            self._lost_bytes *= 0.5

    @property
    def loss_rate(self) -> float:
        total = self._acked_bytes + self._lost_bytes
        return self._lost_bytes / total if total else 0.0

    def loss_heavy(self) -> bool:
        seen = self._acked_bytes + self._lost_bytes
        return seen >= self.horizon_bytes / 2 and self.loss_rate > self.heavy_loss

    @property
    def queue_delay_s(self) -> float:
        """How far the recent RTT sits above its base (0 before enough samples)."""
        if self.recent_rtt_s is None:
            return 0.0
        return max(0.0, self.recent_rtt_s - self.base_rtt_s)

    def queue_building(self) -> bool:
        return self.queue_delay_s > max(self.queue_fraction * self.base_rtt_s, self.queue_floor_s)

    def is_congestion(self, now: float) -> bool:
        """Whether the loss just seen (at `now`, seconds) should shrink the window.

        A growing queue says so at once. Heavy loss alone says so once it has lasted a recent
        RTT: a datagram that overtook a hundred others makes them all "lost" until their ACKs
        arrive, within the reordering delay, and take the bytes back (`not_lost`).
        """
        if self.queue_building():
            return True
        if not self.loss_heavy():
            self._heavy_since = None
            return False
        if self._heavy_since is None:
            self._heavy_since = now
        return now - self._heavy_since >= (self.recent_rtt_s or 0.0)

    @property
    def heavy_pending(self) -> bool:
        """Heavy loss seen, not yet lasted an RTT."""
        return self._heavy_since is not None

    def reduced(self) -> None:
        """The window was shrunk: heavy loss must last another RTT to shrink it again."""
        self._heavy_since = None
