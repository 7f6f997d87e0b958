"""The peer door's limits from settings, and their HTTP half.

The QUIC door admits every request against one PeerTable per server (core/transport/
quic_server.py). The HTTP fallback of the peer door (`POST /peer/<method>`: gossip and
`moe/execute`) is served by the web process, so it keeps a PeerTable of its own with the same
limits, keyed by the request's remote address: a peer that falls back to HTTP, or uses both
doors, gets no more than the limits once per door. Behind a reverse proxy every request
comes from the proxy's address, so there the proxy is one peer (docs/security.md).
"""

from __future__ import annotations

import functools
import time

from django.conf import settings

from core import metrics
from core.transport.admission import PeerLimits, PeerTable, Refusal, peer_key


def peer_limits() -> PeerLimits:
    return PeerLimits(
        max_body=settings.TENZRO_PEER_MAX_BODY_BYTES, max_streams=settings.TENZRO_PEER_MAX_STREAMS,
        rate_per_s=settings.TENZRO_PEER_RATE_PER_S, burst=settings.TENZRO_PEER_BURST,
        max_connections_per_host=settings.TENZRO_PEER_MAX_CONNECTIONS_PER_HOST,
        max_peer_streams=settings.TENZRO_PEER_MAX_STREAMS_PER_PEER,
        per_connection=settings.TENZRO_PEER_LIMIT_BY == "connection",
        ipv6_prefix=settings.TENZRO_PEER_IPV6_PREFIX,
    )


@functools.cache
def _http_table() -> PeerTable:
    return PeerTable(peer_limits())


class HttpPeerSlot:
    """`async with HttpPeerSlot(remote_addr) as refusal:` holds one of the peer's request slots
    for the request's duration; `refusal` is None when admitted, else the limit that refused.
    The web process serves requests on one event loop, so the table needs no lock."""

    def __init__(self, remote_addr: str | None) -> None:
        limits = _http_table().limits
        self.key = peer_key(remote_addr or "?", ipv6_prefix=limits.ipv6_prefix)
        self.refusal: Refusal | None = None

    async def __aenter__(self) -> Refusal | None:
        self.refusal = _http_table().admit(self.key, time.monotonic())
        if self.refusal is not None:
            metrics.PEER_REFUSED.labels("http", self.refusal.reason).inc()
        return self.refusal

    async def __aexit__(self, *exc: object) -> None:
        if self.refusal is None:
            _http_table().release(self.key)
