"""Settings of the QUIC transport and the library configurations built from them.

Every tuning knob has a default read from the environment (docs/operations.md), so the call
sites that build `QuicSettings(max_body=...)` get the tuned transport without naming any
knob; benchmarks and tests pass explicit values. docs/protocol.md, "QUIC transport
parameters", says what each does on the wire and what was measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from core.transport import quic_lib
from core.transport.udp import datagram_size_for, interface_mtu, route_mtu

ALPN = "tenzro/moe"
MIB = 1024 * 1024
# Lanes to one peer at most: a peer door admits 64 connections from one host by default
# (TENZRO_PEER_MAX_CONNECTIONS_PER_HOST), shared with every other node behind that address.
MAX_LANES = 32


class TransportError(Exception):
    """A QUIC call failed; `reason` says why (pin mismatch, timeout, remote error, …).

    `details` are the machine-readable fields a remote error frame carried beside its reason
    (e.g. `missing`); empty for the transport's own errors.
    """

    def __init__(self, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.details = details or {}


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from exc


def _env_str(name: str, default: str) -> str:
    return os.environ.get(name, "").strip() or default


@dataclass(frozen=True)
class QuicSettings:
    """One endpoint's QUIC settings; only `max_body` has no default.

    `max_datagram_size` 0 = the path MTU less IP/UDP headers (probed per peer by a client,
    the listen interface's MTU for a server), capped by what the library carries reliably.
    The windows are QUIC's flow-control credit: the connection window also bounds what one
    peer can make the server buffer, and a stream window smaller than one body makes the
    sender wait a round trip for credit mid-body.
    """

    max_body: int
    max_datagram_size: int = field(default_factory=lambda: _env_int("TENZRO_QUIC_MAX_DATAGRAM", 0))
    idle_timeout_s: float = 60.0
    connection_window: int = field(default_factory=lambda: _env_int("TENZRO_QUIC_CONNECTION_WINDOW", 64 * MIB))
    stream_window: int = field(default_factory=lambda: _env_int("TENZRO_QUIC_STREAM_WINDOW", 64 * MIB))
    # "" = the library's default (aioquic: "tolerant", core/transport/quic_tolerant.py; qh3's
    # native core is not configurable).
    congestion_control: str = field(default_factory=lambda: _env_str("TENZRO_QUIC_CONGESTION", ""))
    # Receive and send buffer asked for on each UDP socket; 0 = the kernel's default.
    socket_buffer_bytes: int = field(default_factory=lambda: _env_int("TENZRO_QUIC_SOCKET_BUFFER", 4 * MIB))
    library: str = field(default_factory=quic_lib.default_library)
    # How long the sends a received datagram prompts (ACKs, stream credit) may wait for an answer or
    # request to carry them (quic_lib.GuardedTransmit); 0 sends them at once, as the libraries do.
    # Below the 25 ms max_ack_delay the libraries announce; long enough that a router's next
    # request to a holder (the next MoE layer) usually carries them.
    ack_hold_s: float = field(default_factory=lambda: _env_int("TENZRO_QUIC_ACK_HOLD_MS", 20) / 1000)
    # A server sends each connection's datagrams in batches where its library can (qh3: GSO through
    # quinn-udp, quic_lib._serve_batched); False keeps asyncio's endpoint, one system call each (the
    # benchmark's reference).
    batched_server: bool = True
    # At most this many connections (lanes) to one peer carry one large request split by rows, when
    # the request is larger than the first connection's congestion window on a path with no standing
    # queue (core/transport/lanes.py); 1 = one connection per peer.
    max_lanes: int = field(default_factory=lambda: _env_int("TENZRO_QUIC_LANES", 16))

    def __post_init__(self) -> None:
        if not 1 <= self.max_lanes <= MAX_LANES:
            raise ValueError(f"TENZRO_QUIC_LANES must be 1-{MAX_LANES}, got {self.max_lanes}")
        if not 0 <= self.ack_hold_s < quic_lib.MAX_ACK_HOLD_S:
            raise ValueError(f"TENZRO_QUIC_ACK_HOLD_MS must be 0-{quic_lib.MAX_ACK_HOLD_S * 1000 - 1:g} (below the "
                             f"peers' 25 ms max_ack_delay), got {self.ack_hold_s * 1000:g}")

    @property
    def lib(self) -> quic_lib.QuicLibrary:
        return quic_lib.load(self.library)

    def datagram_size_to(self, host: str, port: int) -> int:
        """Datagram size a client uses towards host:port (an IP address)."""
        mtu = None if self.max_datagram_size > 0 else route_mtu(host, port)
        return datagram_size_for(mtu, host, ceiling=self.lib.max_datagram_size, configured=self.max_datagram_size)

    def datagram_size_on(self, host: str) -> int:
        """Datagram size a server listening on `host` sends."""
        mtu = None if self.max_datagram_size > 0 else interface_mtu(host)
        return datagram_size_for(mtu, host, ceiling=self.lib.max_datagram_size, configured=self.max_datagram_size)

    def configuration(self, *, is_client: bool, datagram_size: int) -> Any:
        """The library's QuicConfiguration for one endpoint."""
        options: dict[str, Any] = {
            "is_client": is_client, "alpn_protocols": [ALPN], "max_datagram_size": datagram_size,
            "idle_timeout": self.idle_timeout_s, "max_data": self.connection_window,
            "max_stream_data": self.stream_window,
        }
        if self.library == "qh3" and is_client:
            # qh3's client probes for a larger path MTU (DPLPMTUD) from 1,200 bytes up; we size
            # datagrams by the route's MTU already, so the probes would only cost datagrams.
            options["probe_datagram_size"] = False
        configuration = self.lib.configuration(congestion_control=self.congestion_control or None, **options)
        if is_client:
            # What this client tells the server it can receive (quic_lib._advertise_receive_size).
            setattr(configuration, quic_lib.RECEIVE_DATAGRAM_ATTRIBUTE, datagram_size)
        return configuration

    def describe(self) -> dict[str, Any]:
        """The settings as plain values (benchmarks print them)."""
        return {"library": f"{self.library} {self.lib.version}", "max_datagram_size": self.max_datagram_size or "path",
                "connection_window": self.connection_window, "stream_window": self.stream_window,
                "congestion_control": self.congestion_control or self.lib.default_congestion_control
                or "the library's own",
                "socket_buffer_bytes": self.socket_buffer_bytes, "ack_hold_ms": self.ack_hold_s * 1000,
                "max_lanes": self.max_lanes}
