"""How many connections (lanes) one large request to a peer is split over: sans-I/O.

A loss-based congestion controller shrinks its connection's window on every loss; on a path that
loses or reorders 1 % of datagrams at random the window stays at a few dozen datagrams, and a
request larger than the window pays a round trip per window's worth of bytes. qh3's controller
(CUBIC in its compiled core) cannot be changed. Split over n connections to the same peer, each
with its own window, the same bytes take about 1/n of those round trips: 512 KB each way over a
30 ms path with 1 % loss, 1,577 ms on one connection and 172 ms on sixteen (docs/performance.md,
"Loss and reordering on the wire").

The rule (`LanePolicy.wanted`): a request of `nbytes` to a peer whose first connection's
congestion window is `window` goes over ceil(nbytes / window) lanes, at most `max_lanes` and at
most one per `MIN_LANE_BYTES` (a smaller part saves less than its own request costs; a decode
step's request never gets that far). It stays on one when

* it fits in the window: it goes out in one round trip, and more requests would only add work;
* its round trips on one lane would take under `min_transfer_s` (10 ms): on a LAN or loopback a
  window refills in well under a millisecond, and each extra request costs both ends more CPU
  (its frame, its receipt) than the round trips it saves;
* the path shows a standing queue (its recent RTT well above its base, as the tolerant controller
  reads it: loss_signals.CongestionSignal): that loss is congestion, and more connections would
  only take more than one flow's share of a shared bottleneck. The samples are the first
  connection's smoothed RTT at each large request; after `stale_s` without one they start over,
  since a path's RTT from before a pause is no base to read a queue against (a route that
  changed meanwhile would read as a queue for the signal's whole base window);
* `max_lanes` is 1 (TENZRO_QUIC_LANES=1, the setting off).

Imports no QUIC library: the pool (pool.py) reads the window and the RTT from its connection, the
window being the smaller of its own and the one the peer stated on its last large answer (the
answer of a multi-expert request, several times the request, comes in the peer's window).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.transport.loss_signals import CongestionSignal

MIN_LANE_BYTES = 16 * 1024


@dataclass
class LanePolicy:
    """One peer's lane decisions; fed the smoothed RTT of its first connection at each decision."""

    max_lanes: int
    min_transfer_s: float = 0.010
    stale_s: float = 5.0
    path: CongestionSignal = field(default_factory=CongestionSignal)
    _sampled_at: float | None = None

    def wanted(self, nbytes: int, *, window: int | None, rtt_s: float | None, now: float) -> int:
        """Lanes for a request of `nbytes` (1 ..= max_lanes). `window`: the first connection's
        congestion window in bytes (None: unknown); `rtt_s`: its smoothed RTT (None: none yet);
        `now`: monotonic seconds."""
        if rtt_s is not None and rtt_s > 0:
            if self._sampled_at is not None and now - self._sampled_at > self.stale_s:
                self.path = CongestionSignal()
            self._sampled_at = now
            self.path.rtt_sample(rtt_s, now)
        if self.max_lanes <= 1 or not window or window <= 0 or nbytes <= window or rtt_s is None:
            return 1
        rounds = -(-nbytes // window)
        # the path's own RTT (its base, once known): a sample stretched by a busy peer is no path to split for
        if rounds * min(rtt_s, self.path.base_rtt_s) < self.min_transfer_s or self.path.queue_building():
            return 1
        return max(1, min(self.max_lanes, rounds, nbytes // MIN_LANE_BYTES))
