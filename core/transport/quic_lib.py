"""The one place that imports a QUIC library: qh3 (default) or aioquic, behind the same seam.

Both expose the same sans-I/O connection and asyncio adapter (qh3 began as a fork of
aioquic; 2.x moved the packet core to Rust). What differs, and is hidden here: where the
peer's certificate and address live, how large a datagram each library carries correctly,
which congestion controllers can be chosen, and qh3's client understating the datagrams it
can receive (corrected below).

Why qh3 is the default (`python -m bench.transport_quic`, docs/protocol.md "QUIC transport
parameters"): on the same echo it spends 2–5x less CPU per byte than aioquic at 1–4 MB
bodies and carries 64 KB datagrams, where aioquic cannot go past 16 KiB. Both beat the
node's JSON-RPC door at every size measured. `TENZRO_QUIC_LIB=aioquic` switches a node back
(docs/operations.md).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from . import quic_tolerant

logger = logging.getLogger(__name__)

LIBRARIES = ("qh3", "aioquic")
DEFAULT_LIBRARY = "qh3"

# The largest datagram each library is trusted with, whatever the path carries. aioquic 1.7
# writes every STREAM and CRYPTO frame's length as a two-byte varint (at most 16,383), so a
# frame filling a larger datagram goes out corrupt and the peer closes the connection
# ("Unknown frame type": nothing is delivered at 24 KiB and above; aioquic's issues #421 and
# #519 report large datagrams breaking); 16 KiB datagrams keep every frame below that. qh3 batches with UDP GSO,
# whose kernel limit is 64 KiB of payload per send, and caps one datagram at 65,000 bytes.
_MAX_DATAGRAM = {"aioquic": 16_384, "qh3": 65_000}
# Congestion controllers selectable through the configuration; qh3's native core has one
# controller that is not configurable from Python. "tolerant" is ours (quic_tolerant.py), and
# aioquic's default here: random loss and reordering do not stall it (docs/performance.md).
_CONGESTION = {"aioquic": (quic_tolerant.NAME, "reno", "cubic"), "qh3": ()}


def default_library() -> str:
    """The library named by `TENZRO_QUIC_LIB`, else the default (qh3)."""
    return os.environ.get("TENZRO_QUIC_LIB", "").strip() or DEFAULT_LIBRARY


@dataclass(frozen=True)
class QuicLibrary:
    """One QUIC library's entry points, as used by the transport."""

    name: str
    version: str
    configuration_class: type
    protocol_class: type  # asyncio QuicConnectionProtocol
    connect: Any  # asynccontextmanager: connect(host, port, configuration=, create_protocol=)
    serve: Any  # coroutine: serve(host, port, configuration=, create_protocol=) -> server
    # The same on a UDP transport that sends a connection's datagrams in batches (GSO); None where
    # the library has none (aioquic: its endpoint sends one datagram per system call).
    serve_batched: Any
    events: ModuleType
    # What the connection raises when asked to send after it closed itself (e.g. on a protocol
    # error it detected) before its ConnectionTerminated event was handled.
    connection_error: type[Exception]
    max_datagram_size: int
    congestion_controls: tuple[str, ...]

    def peer_certificate_der(self, quic: Any) -> bytes | None:
        """DER of the certificate the peer presented, once the handshake has run."""
        if self.name == "qh3":
            certificate = quic.get_peercert()
            return None if certificate is None else bytes(certificate.public_bytes())
        # aioquic keeps the peer certificate on its TLS context and has no public accessor.
        from cryptography.hazmat.primitives.serialization import Encoding

        certificate = getattr(quic.tls, "_peer_certificate", None)
        return None if certificate is None else certificate.public_bytes(Encoding.DER)

    def peer_address(self, quic: Any) -> tuple[str, int] | None:
        """(host, port) of the connection's peer; IPv4-mapped IPv6 addresses are unwrapped."""
        if self.name == "qh3":
            address = getattr(quic, "_remote_addr", None)
        else:
            paths = getattr(quic, "_network_paths", None)
            address = paths[0].addr if paths else None
        if not address:
            return None
        host = str(address[0])
        return (host.removeprefix("::ffff:"), int(address[1]))

    def path_state(self, quic: Any) -> tuple[int | None, float | None]:
        """(congestion window in bytes, smoothed RTT in seconds) of a connection; None where there is
        none yet (before the handshake, or before the first acknowledgement). The smoothed RTT, not
        the latest sample: its samples have the peer's stated ACK delay taken out, and a holder holds
        a request's ACK while it computes (quic_lib.GuardedTransmit)."""
        if self.name == "qh3":
            core = getattr(quic, "_core", None)
            return (None, None) if core is None else (core.congestion_window, core.smoothed_rtt)
        recovery = quic._loss
        return recovery.congestion_window, recovery._rtt_smoothed if recovery._rtt_initialized else None

    @property
    def default_congestion_control(self) -> str | None:
        """The controller a configuration gets unless one is named (None: the library's own, fixed)."""
        return self.congestion_controls[0] if self.congestion_controls else None

    def configuration(self, *, congestion_control: str | None, **kwargs: Any) -> Any:
        """A QuicConfiguration; `congestion_control` (default: the first offered) where there is a choice."""
        if self.congestion_controls:
            congestion_control = congestion_control or self.default_congestion_control
            if congestion_control not in self.congestion_controls:
                raise ValueError(f"{self.name} offers congestion control {self.congestion_controls}, "
                                 f"not {congestion_control!r}")
            kwargs["congestion_control_algorithm"] = congestion_control
        return self.configuration_class(**kwargs)


# A transmit the library's core failed is retried after 10 ms, then after 4x as long as the
# transmits have been failing, at most 0.25 s; a connection whose transmits have all failed for
# TRANSMIT_GIVE_UP_S is ended (HANDSHAKE_GIVE_UP_S before its handshake completed). Most failures
# pass: qh3's server fails the transmits of a handshake whose flight does not fit yet (an aioquic
# client, every time: the server may send 3x what it received until the client's address is
# validated) and succeeds once the client's next datagrams came, which on a loaded machine or after
# the client's backed-off retransmissions can take more than a second.
TRANSMIT_RETRY_FIRST_S, TRANSMIT_RETRY_MAX_S = 0.01, 0.25
TRANSMIT_GIVE_UP_S, HANDSHAKE_GIVE_UP_S = 1.0, 10.0
# A hold at or past the max_ack_delay both libraries announce (25 ms) would make the peer's loss
# detection fire on ACKs it is owed (QuicSettings refuses one).
MAX_ACK_HOLD_S = 0.025


class GuardedTransmit:
    """Mixed in before the library's asyncio protocol: its transmit, with the core's own failures handled
    and the sends a received datagram prompts held back a moment.

    Failures: qh3's packet core can raise from inside a transmit ("packet builder capacity
    exhausted"). The library's asyncio adapter does not catch it: the loop logged an ERROR
    traceback and, when the transmit was the timer's, left the connection without a timer (no
    retransmission, no idle timeout: half-dead for good; seen on a server whose peer had restarted).
    Here a failed transmit is retried; when every transmit has failed for TRANSMIT_GIVE_UP_S,
    `closed_by_library` ends the connection as each side ends a ConnectionTerminated.

    Held-back sends: after each datagram it receives, the library transmits at once what the
    datagram prompted, which for one small request and its answer on qh3 is three datagrams more
    than the two that carry them (the server's ACK of the request, the client's ACK of the answer,
    the server's new stream credit once that ACK arrives, and its ACK): each one a system call on
    one side and a wake-up on the other, in the middle of the caller's step. When `ack_hold_s` > 0
    and the connection `may_hold` (nothing half-received that the peer is waiting to send on), that
    transmit is held for up to `ack_hold_s`: an answer or request sent meanwhile carries the ACKs
    and credit, and otherwise they go when the hold ends. Sends of our own (`transmit_now`), timers
    and the handshake are never held. `ack_hold_s` stays below the 25 ms max_ack_delay both
    libraries announce, so the peer's loss detection allows for it."""

    _lib: ClassVar[QuicLibrary]
    _loop: asyncio.AbstractEventLoop  # the library's protocol sets it
    _quic: Any  # the library's QuicConnection (set by the protocol base class)
    closed_by_library: Callable[[str], None]  # each side's: end the connection as a ConnectionTerminated would
    _failing_since: float | None = None  # loop time of the first of the failed transmits in a row
    _transmit_retry: asyncio.TimerHandle | None = None
    _transmit_given_up = False
    ack_hold_s = 0.0
    _receiving = False  # inside the library's datagram(s)_received
    _held: asyncio.TimerHandle | None = None

    def datagram_received(self, data: Any, addr: Any) -> None:
        self._receiving = True
        try:
            super().datagram_received(data, addr)  # type: ignore[misc]
        finally:
            self._receiving = False

    def datagrams_received(self, data: Any, addr: Any) -> None:  # qh3 hands over a batch (recvmmsg/GRO)
        self._receiving = True
        try:
            super().datagrams_received(data, addr)  # type: ignore[misc]
        finally:
            self._receiving = False

    def may_hold(self) -> bool:
        """Whether what a received datagram prompts may wait (each side says; default: no)."""
        return False

    def _handshake_complete(self) -> bool:
        # the connection's own flag: the asyncio adapters' `_connected` is a client's only (aioquic)
        return bool(self._quic._handshake_complete)

    def transmit_now(self) -> None:
        """Send what our own code just queued (an answer, a request, a refusal): never held."""
        receiving, self._receiving = self._receiving, False
        try:
            self.transmit()
        finally:
            self._receiving = receiving

    def transmit(self) -> None:
        # may_hold is asked on every receive: the server's says whether this one brought a whole request
        if self._receiving and self.ack_hold_s > 0 and self.may_hold() and self._handshake_complete():
            if self._held is None:
                self._held = self._loop.call_later(self.ack_hold_s, self._release_held)
            return
        if self._held is not None:
            self._held.cancel()
            self._held = None
        try:
            super().transmit()  # type: ignore[misc]
        except self._lib.connection_error as exc:
            self._transmit_failed(exc)
        else:
            self._failing_since = None

    def _release_held(self) -> None:
        self._held = None
        self.transmit()

    def _transmit_failed(self, exc: Exception) -> None:
        if self._transmit_given_up:
            return
        now = self._loop.time()
        if self._failing_since is None:
            self._failing_since = now
        failing_for = now - self._failing_since
        if failing_for >= (TRANSMIT_GIVE_UP_S if self._handshake_complete() else HANDSHAKE_GIVE_UP_S):
            self._transmit_given_up = True
            self.closed_by_library(f"closed by the library: {exc} (every transmit for {failing_for:.2f} s)")
            return
        if self._transmit_retry is None or self._transmit_retry.when() <= now:  # none pending
            delay = min(TRANSMIT_RETRY_MAX_S, max(TRANSMIT_RETRY_FIRST_S, 4 * failing_for))
            logger.debug("QUIC transmit failed in the library (%s): retried in %g s", exc, delay)
            self._transmit_retry = self._loop.call_later(delay, self.transmit)



# Attribute our client configurations carry: the largest UDP payload this client receives.
RECEIVE_DATAGRAM_ATTRIBUTE = "tenzro_max_udp_payload_size"


def _advertise_receive_size(tls_bridge: ModuleType) -> None:
    """Make qh3's client advertise the datagram size it really receives.

    qh3 2.1's client always sends the transport parameter max_udp_payload_size = 1472 (what a
    browser on Ethernet would say), and its server obeys the peer's value: with qh3 at both
    ends every answer came back in 1,443-byte datagrams whatever the path carried, three
    times slower than the requests (bench/transport_quic.py). The parameter is the largest
    UDP payload the endpoint is willing to receive (RFC 9000, 18.2); our client reads whole
    64 KiB datagrams, so it advertises the datagram size it chose for the path. Only
    configurations built by quic_config.py carry the attribute; any other qh3 user in the
    process is left as it was.
    """
    bridge = tls_bridge.QuicTlsBridge
    if getattr(bridge, "_tenzro_wrapped", False):
        return
    original = bridge.serialize_transport_parameters
    buffer_class, pull, push = tls_bridge.Buffer, tls_bridge.pull_quic_transport_parameters, \
        tls_bridge.push_quic_transport_parameters

    def serialize_transport_parameters(self: Any) -> bytes:
        data = original(self)
        size = getattr(self.configuration, RECEIVE_DATAGRAM_ATTRIBUTE, None)
        if not size or not self.configuration.is_client:
            return data
        parameters = pull(buffer_class(data=data))
        parameters.max_udp_payload_size = int(size)
        out = buffer_class(capacity=len(data) + 16)  # the new value's varint is at most 4 bytes longer
        push(out, parameters)
        return out.data

    bridge.serialize_transport_parameters = serialize_transport_parameters
    bridge._tenzro_wrapped = True


async def _serve_batched(host: str, port: int, *, configuration: Any, create_protocol: Callable[..., Any]) -> Any:
    """qh3's serve() on the UDP transport its connect() uses (quinn-udp: GSO sends, GRO and
    recvmmsg receives) instead of asyncio's plain endpoint, which qh3's serve() takes and which
    sends every datagram with its own system call. A holder's answers go out this way: a 1 MB
    answer on an Ethernet path is ~720 datagrams, sent in batches of up to 64 KiB a call (a 1 MB
    echo over 1,452-byte datagrams in one process: 26.8 ms of CPU → 15.7, bench.transport_quic).
    Where the kernel refuses GSO the transport turns it off and sends one at a time, as before."""
    # Imported by name, as every library module here: this file is the seam (pyproject's import contracts).
    create_transport = importlib.import_module("qh3.asyncio._transport").create_optimized_datagram_transport
    server_class = importlib.import_module("qh3.asyncio.server").QuicServer
    loop = asyncio.get_running_loop()
    family, kind, proto, _, address = (await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM))[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    _, server = await create_transport(
        loop, lambda: server_class(configuration=configuration, create_protocol=create_protocol), sock=sock)
    return server


@functools.cache
def load(name: str | None = None) -> QuicLibrary:
    """The library `name` (default: `default_library()`); ValueError for an unknown one."""
    name = name or default_library()
    if name not in LIBRARIES:
        raise ValueError(f"unknown QUIC library {name!r}; choose one of {', '.join(LIBRARIES)}")
    package = importlib.import_module(name)
    asyncio_api = importlib.import_module(f"{name}.asyncio")
    configuration = importlib.import_module(f"{name}.quic.configuration")
    events = importlib.import_module(f"{name}.quic.events")
    if name == "qh3":
        _advertise_receive_size(importlib.import_module("qh3.quic.tls_bridge"))
    else:
        quic_tolerant.install(recovery=importlib.import_module("aioquic.quic.recovery"),
                              congestion=importlib.import_module("aioquic.quic.congestion.base"),
                              connection=importlib.import_module("aioquic.quic.connection"))
    return QuicLibrary(
        name=name, version=str(getattr(package, "__version__", "?")),
        configuration_class=configuration.QuicConfiguration, protocol_class=asyncio_api.QuicConnectionProtocol,
        connect=asyncio_api.connect, serve=asyncio_api.serve, serve_batched=_serve_batched if name == "qh3" else None,
        events=events,
        connection_error=importlib.import_module(f"{name}.quic.connection").QuicConnectionError,
        max_datagram_size=_MAX_DATAGRAM[name], congestion_controls=_CONGESTION[name],
    )
