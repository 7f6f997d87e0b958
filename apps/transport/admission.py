"""Per-peer admission on the peer door, sans-I/O: concurrent streams and request rate.

One `PeerAdmission` per QUIC connection. A request stream is admitted on its first byte
(so a peer cannot hold buffers with streams it never finishes) and released when its answer
is sent or the stream dies. The rate is a token bucket: `rate_per_s` tokens a second up to
`burst`, one per request. A refused stream is answered at once with an error frame naming
the limit; it never queues, so an abusive peer gets errors, not a hang, and costs the node
no compute. The body-size limit is the frame decoder's `max_body`, checked on the prefix.

Pure: the caller passes `now` (monotonic seconds), so tests need no clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PeerLimits:
    """Limits of one peer connection (settings TENZRO_PEER_*, docs/operations.md)."""

    max_body: int
    max_streams: int = 32
    rate_per_s: float = 200.0
    burst: int = 400
    max_connections_per_host: int = 64


@dataclass(frozen=True)
class Refusal:
    reason: str  # "too_many_streams" | "rate_limited"
    message: str


class PeerAdmission:
    """Admission state of one connection: in-flight streams and the token bucket."""

    def __init__(self, limits: PeerLimits, *, now: float) -> None:
        self.limits = limits
        self.in_flight = 0
        self.refused = 0
        self._tokens = float(limits.burst)
        self._stamp = now

    def admit(self, now: float) -> Refusal | None:
        """Take one stream slot and one token, or say which limit refuses the request."""
        # Refill first; time never runs backwards for a monotonic clock, but clamp anyway.
        refill = max(0.0, now - self._stamp) * self.limits.rate_per_s
        self._tokens = min(float(self.limits.burst), self._tokens + refill)
        self._stamp = now
        if self.in_flight >= self.limits.max_streams:
            self.refused += 1
            return Refusal("too_many_streams", f"more than {self.limits.max_streams} requests in flight on this "
                                               "connection; wait for answers before sending more")
        if self._tokens < 1.0:
            self.refused += 1
            retry = (1.0 - self._tokens) / self.limits.rate_per_s
            return Refusal("rate_limited", f"over {self.limits.rate_per_s:g} requests/s (burst {self.limits.burst}); "
                                           f"retry in {retry:.3f} s")
        self._tokens -= 1.0
        self.in_flight += 1
        return None

    def release(self) -> None:
        """An admitted stream was answered or died."""
        if self.in_flight <= 0:
            raise RuntimeError("release() without a matching admit()")
        self.in_flight -= 1
