"""Per-peer admission on the peer door, sans-I/O: connections, concurrent streams, request rate.

A *peer* is who the door can tell apart without trusting anything the peer says: the remote
address, an IPv4 host or an IPv6 /64 network (one subscriber's usual allocation, so a peer
cannot multiply itself by hopping addresses inside its own prefix) — `peer_key`. Every
connection from one peer shares that peer's allowance in one `PeerTable` per server: its
connections (`max_connections_per_host`), its requests in flight over all its connections
(`max_peer_streams`) and one token bucket (`rate_per_s` tokens a second up to `burst`, one per
request). So opening more connections buys a peer no more than one connection gets; on top of
that each connection holds at most `max_streams` requests in flight. The trade-off (peers
behind one NAT share one allowance; several test nodes on 127.0.0.1 share one) is documented
in docs/security.md; `per_connection=True` (TENZRO_PEER_LIMIT_BY=connection) restores one
bucket per connection for networks where that matters more.

A request stream is admitted on its first byte (so a peer cannot hold buffers with streams it
never finishes) and released when its answer is sent or the stream dies. A refused stream is
answered at once with an error frame naming the limit; it never queues, so an abusive peer
gets errors, not a hang, and costs the node no compute. The body-size limit is the frame
decoder's `max_body`, checked on the prefix.

Pure: the caller passes `now` (monotonic seconds), so tests need no clock.
"""

from __future__ import annotations

import ipaddress
import itertools
from dataclasses import dataclass

_connection_ids = itertools.count()


@dataclass(frozen=True)
class PeerLimits:
    """Limits of the peer door (settings TENZRO_PEER_*, docs/operations.md)."""

    max_body: int
    max_streams: int = 32  # per connection
    rate_per_s: float = 200.0  # per peer, over all its connections
    burst: int = 400
    max_connections_per_host: int = 64
    max_peer_streams: int = 256  # per peer, over all its connections
    per_connection: bool = False  # rate and peer streams per connection instead of per peer
    ipv6_prefix: int = 64


@dataclass(frozen=True)
class Refusal:
    reason: str  # "too_many_streams" | "rate_limited" | "too_many_connections"
    message: str


def peer_key(host: str, *, ipv6_prefix: int = 64) -> str:
    """Who a remote address counts as: an IPv4 host, an IPv6 network of `ipv6_prefix` bits
    (an IPv4-mapped IPv6 address counts as its IPv4 host), or the string itself."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, ipv6_prefix), strict=False))
    return str(address)


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    in_flight: int = 0
    connections: int = 0


class PeerTable:
    """Every peer's shared state on one server. Idle peers are forgotten once their bucket has
    refilled (so forgetting never hands a peer a fresh burst early) and the table is large."""

    def __init__(self, limits: PeerLimits, *, max_tracked: int = 65_536) -> None:
        self.limits = limits
        self.max_tracked = max_tracked
        self._peers: dict[str, _Bucket] = {}
        self._next_sweep = float("-inf")
        self.refused = 0

    def _bucket(self, key: str, now: float) -> _Bucket:
        bucket = self._peers.get(key)
        if bucket is None:
            # A sweep walks the whole table: at most one a second, so a flood of new addresses
            # cannot make every new peer pay for it (between sweeps the table may grow past the mark).
            if len(self._peers) >= self.max_tracked and now >= self._next_sweep:
                self._next_sweep = now + 1.0
                self._forget_idle(now)
            bucket = self._peers[key] = _Bucket(tokens=float(self.limits.burst), stamp=now)
        return bucket

    def _forget_idle(self, now: float) -> None:
        full_after = self.limits.burst / max(self.limits.rate_per_s, 1e-9)
        for key in [k for k, b in self._peers.items()
                    if not b.connections and not b.in_flight and now - b.stamp >= full_after]:
            del self._peers[key]

    def connect(self, host_key: str, now: float) -> Refusal | None:
        """Count a new connection from `host_key`, or refuse it (the caller then closes it)."""
        bucket = self._bucket(host_key, now)
        if bucket.connections >= self.limits.max_connections_per_host:
            self.refused += 1
            return Refusal("too_many_connections", f"more than {self.limits.max_connections_per_host} "
                                                   "connections from this host")
        bucket.connections += 1
        return None

    def disconnect(self, host_key: str) -> None:
        bucket = self._peers.get(host_key)
        if bucket is not None and bucket.connections > 0:
            bucket.connections -= 1

    def admit(self, key: str, now: float) -> Refusal | None:
        """Take one of `key`'s stream slots and one of its tokens, or say which limit refuses."""
        bucket = self._bucket(key, now)
        # Refill first; time never runs backwards for a monotonic clock, but clamp anyway.
        bucket.tokens = min(float(self.limits.burst),
                            bucket.tokens + max(0.0, now - bucket.stamp) * self.limits.rate_per_s)
        bucket.stamp = now
        if bucket.in_flight >= self.limits.max_peer_streams:
            self.refused += 1
            return Refusal("too_many_streams", f"more than {self.limits.max_peer_streams} requests in flight "
                                               "from this peer; wait for answers before sending more")
        if bucket.tokens < 1.0:
            self.refused += 1
            retry = (1.0 - bucket.tokens) / self.limits.rate_per_s
            return Refusal("rate_limited", f"over {self.limits.rate_per_s:g} requests/s from this peer "
                                           f"(burst {self.limits.burst}); retry in {retry:.3f} s")
        bucket.tokens -= 1.0
        bucket.in_flight += 1
        return None

    def release(self, key: str) -> None:
        bucket = self._peers.get(key)
        if bucket is None or bucket.in_flight <= 0:
            raise RuntimeError("release() without a matching admit()")
        bucket.in_flight -= 1

    def drop(self, key: str) -> None:
        """Forget a connection's own bucket (per-connection limits) when the connection ends."""
        self._peers.pop(key, None)

    def __len__(self) -> int:
        return len(self._peers)


class PeerAdmission:
    """Admission state of one connection: its own in-flight streams, and its peer's share of
    `table` (a private table when none is given: one connection alone, as in unit tests)."""

    def __init__(self, limits: PeerLimits, *, now: float, table: PeerTable | None = None,
                 host: str = "?") -> None:
        self.limits = limits
        self.table = table if table is not None else PeerTable(limits)
        self.in_flight = 0
        self.refused = 0
        host_key = peer_key(host, ipv6_prefix=limits.ipv6_prefix)
        # Per connection: a key no other connection has (close() drops its bucket).
        self.key = f"{host_key}#{next(_connection_ids)}" if limits.per_connection else host_key
        self.table._bucket(self.key, now)

    def admit(self, now: float) -> Refusal | None:
        """Take one stream slot (of the connection and of its peer) and one token, or refuse."""
        if self.in_flight >= self.limits.max_streams:
            self.refused += 1
            return Refusal("too_many_streams", f"more than {self.limits.max_streams} requests in flight on this "
                                               "connection; wait for answers before sending more")
        refusal = self.table.admit(self.key, now)
        if refusal is not None:
            self.refused += 1
            return refusal
        self.in_flight += 1
        return None

    def release(self) -> None:
        """An admitted stream was answered or died."""
        if self.in_flight <= 0:
            raise RuntimeError("release() without a matching admit()")
        self.in_flight -= 1
        self.table.release(self.key)

    def close(self) -> None:
        """The connection ended (its streams already released)."""
        if self.limits.per_connection:
            self.table.drop(self.key)
