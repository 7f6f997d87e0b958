"""Client side of the QUIC transport: pinned connections and one request per stream.

The client pins the server's certificate by its SHA-256 fingerprint (the one in the
server's signed provider record) instead of trusting a CA, and checks it before it sends
anything. A call whose awaiting task is cancelled (or times out) resets its stream both
ways, so the server stops working on it (quic_server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

from core.transport import quic_lib
from core.transport.framing import KIND_RESPONSE, Body, Frame, FrameDecoder, FramingError, request_frame_parts
from core.transport.pinning import certificate_sha256
from core.transport.quic_config import QuicSettings, TransportError
from core.transport.udp import tune_socket

logger = logging.getLogger(__name__)

# QUIC application error code of a stream the client gave up (RESET_STREAM and STOP_SENDING).
CANCELLED_STREAM = 0x11


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _ClientConnection(quic_lib.GuardedTransmit):
    """One client connection; mixed into the QUIC library's asyncio protocol class."""

    _quic: Any

    def __init__(self, *args: Any, max_body: int = 0, socket_buffer_bytes: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_body = max_body
        self._socket_buffer_bytes = socket_buffer_bytes
        self._waiters: dict[int, tuple[FrameDecoder, asyncio.Future[Frame]]] = {}
        self.terminated: str | None = None  # why the connection ended, once it has
        self.last_received = time.monotonic()  # any datagram from the peer: it is alive
        # The server's congestion window toward us, as its last large answer stated it (`window`,
        # docs/protocol.md "Frame"); None until one did.
        self.peer_window: int | None = None

    # -- asyncio ------------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        # Before the handshake's first datagram, so the whole connection has the buffers.
        self.socket_buffers = tune_socket(transport.get_extra_info("socket"), self._socket_buffer_bytes)

    def datagram_received(self, data: Any, addr: Any) -> None:
        self.last_received = time.monotonic()
        super().datagram_received(data, addr)  # type: ignore[misc]

    def datagrams_received(self, data: Any, addr: Any) -> None:  # qh3 hands over a batch (recvmmsg/GRO)
        self.last_received = time.monotonic()
        super().datagrams_received(data, addr)  # type: ignore[misc]

    async def wait_connected(self) -> None:
        """The library's, without its orphan: it awaits a shielded future, so a handshake given up (our
        timeout) leaves that future behind, and when the connection then closes the library sets
        ConnectionError on it with nobody to read it ("Future exception was never retrieved" at
        ERROR on every unreachable peer). Marked read here."""
        try:
            await super().wait_connected()  # type: ignore[misc]
        except asyncio.CancelledError:
            waiter = getattr(self, "_connected_waiter", None)
            if waiter is not None:
                waiter.add_done_callback(_retrieved)
            raise

    # -- calls --------------------------------------------------------------------------------

    async def ping_within(self, timeout_s: float) -> float:
        """Seconds from a PING to its acknowledgement; TimeoutError past `timeout_s`, ConnectionError
        when the connection ends first. The library shields its waiter from the timeout's cancel, so
        a PING given up on is left a callback that retrieves its end (else a connection lost later
        logs "Future exception was never retrieved" at ERROR)."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                await self.ping()
        except BaseException as exc:
            for waiter in list(getattr(self, "_ping_waiters", {}).values()):
                waiter.add_done_callback(_retrieved)
            if isinstance(exc, self._lib.connection_error):  # closed in the library's core, its event not yet in
                self.terminated = self.terminated or f"closed by the library: {exc}"
                raise ConnectionError(f"connection closed: {self.terminated}") from exc
            raise
        return time.monotonic() - started

    def peer_certificate_sha256(self) -> str | None:
        der = self._lib.peer_certificate_der(self._quic)
        return None if der is None else certificate_sha256(der)

    async def call(self, method: str, params: dict[str, Any], body: Body) -> Frame:
        """Send one request on a new stream and wait for its response frame.

        Cancelling the awaiting task resets the stream (see `_abandon`).
        """
        if self.terminated is not None:
            raise TransportError("connection_closed", f"connection closed: {self.terminated}")
        stream_id = self._quic.get_next_available_stream_id()
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiters[stream_id] = (FrameDecoder(max_body=self._max_body, body_setting="TENZRO_QUIC_MAX_BODY"), future)
        head, payload = request_frame_parts(method, params, body)
        try:
            # Two writes, not one joined buffer: the library copies each into its send buffer.
            self._quic.send_stream_data(stream_id, head, end_stream=not len(payload))
            if len(payload):
                self._quic.send_stream_data(stream_id, payload, end_stream=True)
            self.transmit_now()
            return await future
        except asyncio.CancelledError:
            self._abandon(stream_id)
            raise
        except self._lib.connection_error as exc:
            # The connection closed itself (seen under 30 ms RTT with loss: qh3 closed on a peer's
            # FinalSizeSmallerThanReceived) and its ConnectionTerminated event has not been handled
            # yet: it is dead. Say so, so the pool drops it and the caller routes elsewhere; before,
            # this escaped as an internal error and every later call reused the dead connection.
            self.terminated = self.terminated or f"closed by the library: {exc}"
            raise TransportError("connection_closed", f"connection closed: {self.terminated}") from exc
        finally:
            self._waiters.pop(stream_id, None)

    def may_hold(self) -> bool:
        """Hold the ACK of an answer while no call waits: the next request carries it
        (quic_lib.GuardedTransmit). Not while an answer is half-received or a request unanswered."""
        return all(future.done() for _, future in self._waiters.values())

    def closed_by_library(self, why: str) -> None:
        """The library's core failed transmit after transmit (quic_lib.GuardedTransmit): the connection is dead,
        its calls fail with `connection_closed`, the pool drops it and the next call reconnects."""
        if self.terminated is None:
            logger.warning("QUIC connection %s: dropped", why)
        self._terminate(why)

    def _terminate(self, why: str) -> None:
        """Mark the connection dead and fail every call waiting on it."""
        self.terminated = self.terminated or why
        for _, future in self._waiters.values():
            if not future.done():
                future.set_exception(TransportError("connection_closed", f"connection closed: {self.terminated}"))

    def _abandon(self, stream_id: int) -> None:
        """Give a stream up: RESET_STREAM stops our request, STOP_SENDING the server's answer.

        RESET_STREAM alone is not enough: once the request was sent whole, the server may
        already hold all of it and ignore the reset; STOP_SENDING reaches its send side,
        which is what tells its handler that nobody is waiting.
        """
        if self.terminated is not None:
            return
        for stop in (self._quic.reset_stream, self._quic.stop_stream):
            with contextlib.suppress(Exception):  # the stream's side may already be finished
                stop(stream_id, CANCELLED_STREAM)
        self.transmit_now()

    def quic_event_received(self, event: Any) -> None:
        events = self._lib.events
        if isinstance(event, events.StreamDataReceived):
            waiter = self._waiters.get(event.stream_id)
            if waiter is None:
                return
            decoder, future = waiter
            try:
                frames = decoder.feed(event.data)
                if event.end_stream:
                    decoder.finish()
            except FramingError as exc:
                if not future.done():
                    future.set_exception(TransportError(exc.reason, str(exc)))
                return
            for frame in frames:
                if not future.done() and frame.kind == KIND_RESPONSE:
                    window = frame.header.get("window")
                    if type(window) is int and window > 0:
                        self.peer_window = window
                    future.set_result(frame)
        elif isinstance(event, events.StreamReset):
            waiter = self._waiters.get(event.stream_id)
            if waiter is not None and not waiter[1].done():
                waiter[1].set_exception(TransportError("stream_reset", f"the server reset the stream "
                                                                       f"(code {event.error_code})"))
        elif isinstance(event, events.ConnectionTerminated):
            self.terminated = event.reason_phrase or f"error {event.error_code}"  # the peer's word stands
            self._terminate(self.terminated)

    @property
    def in_flight(self) -> int:
        return len(self._waiters)


@functools.cache
def _protocol_class(library: str) -> type:
    lib = quic_lib.load(library)
    return type(f"ClientProtocol[{library}]", (_ClientConnection, lib.protocol_class), {"_lib": lib})


# Connections closed by close_soon that are waiting out their closing period: kept referenced so
# their tasks run to the end (asyncio keeps only weak references to tasks).
_CLOSING: set[asyncio.Task[None]] = set()


def closing_count() -> int:
    """How many connections closed by `close_soon` still wait out their closing period."""
    return len(_CLOSING)


class OpenConnection:
    """A handshaken, pin-checked client connection and how to close it."""

    def __init__(self, protocol: Any, opening: Any, where: str) -> None:
        self.protocol = protocol
        self._opening = opening
        self.where = where

    async def close(self) -> None:
        """Close the connection (CONNECTION_CLOSE) and its socket; waits out the closing period
        (three PTOs, RFC 9000 section 10.2). Cancelled while it waits, it still closes the socket."""
        try:
            await self._opening.__aexit__(None, None, None)
        except asyncio.CancelledError:  # e.g. asyncio.run ending with the wait still pending
            self._close_socket()
            raise
        except Exception:  # closing a connection that already died
            self._close_socket()

    def close_soon(self) -> asyncio.Task[None]:
        """Send CONNECTION_CLOSE now and wait out the closing period in a task, so that a caller who
        has its answer does not wait those three PTOs (about 90 ms on loopback) for nothing. The peer
        learns of the close at once either way; the task closes the socket at the end."""
        with contextlib.suppress(Exception):  # a connection that already died sends nothing
            self.protocol.close()
        task = asyncio.ensure_future(self.close())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)
        return task

    def _close_socket(self) -> None:
        transport = getattr(self.protocol, "_transport", None)
        if transport is not None:
            transport.close()


async def open_connection(*, host: str, port: int, pin_sha256: str, settings: QuicSettings,
                          timeout_s: float) -> OpenConnection:
    """Connect, complete the handshake and check the certificate pin before anything is sent.

    Raises TransportError: `timeout`, `connection_failed` or `certificate_pin_mismatch`.
    """
    where = f"{host}:{port}"
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise TransportError("connection_failed", f"could not resolve {where}: {exc}") from exc
    datagram_size = settings.datagram_size_to(str(infos[0][4][0]), port)
    configuration = settings.configuration(is_client=True, datagram_size=datagram_size)
    # Trust comes from the pin below, not from a CA: the certificate is self-signed.
    configuration.verify_mode = ssl.CERT_NONE
    protocol_class = _protocol_class(settings.library)

    def create_protocol(*args: Any, **kwargs: Any) -> Any:
        protocol = protocol_class(*args, max_body=settings.max_body, socket_buffer_bytes=settings.socket_buffer_bytes,
                                  **kwargs)
        protocol.ack_hold_s = settings.ack_hold_s
        return protocol

    opening = settings.lib.connect(host, port, configuration=configuration, create_protocol=create_protocol)
    try:
        async with asyncio.timeout(timeout_s):
            protocol = await opening.__aenter__()
    except TimeoutError as exc:
        raise TransportError("timeout", f"no QUIC handshake with {where} within {timeout_s:.3g} s") from exc
    except OSError as exc:  # ConnectionError (the handshake was refused or aborted), unreachable networks
        raise TransportError("connection_failed", f"could not reach {where}: {exc}") from exc
    connection = OpenConnection(protocol, opening, where)
    seen = protocol.peer_certificate_sha256()
    if seen is None or seen != pin_sha256.lower():
        await connection.close()
        raise TransportError("certificate_pin_mismatch",
                             f"{where} presented certificate sha256 {seen}, expected {pin_sha256}")
    return connection


async def call_on(connection: OpenConnection, method: str, params: dict[str, Any], body: Body, *,
                  timeout_s: float) -> tuple[dict[str, Any], bytes | bytearray]:
    """One request on an open connection; a remote error frame raises TransportError(reason)."""
    try:
        async with asyncio.timeout(timeout_s):
            frame = await connection.protocol.call(method, params, body)
    except TimeoutError as exc:
        raise TransportError("timeout", f"no answer from {connection.where} within {timeout_s} s") from exc
    return result_of(frame)


def result_of(frame: Frame) -> tuple[dict[str, Any], bytes | bytearray]:
    """(result, body) of a response frame; an error frame raises TransportError(its reason)."""
    header = frame.header
    if not header.get("ok"):
        error = header.get("error") or {}
        details = error.get("details")
        raise TransportError(error.get("reason", "remote_error"), error.get("message", "remote error"),
                             details if isinstance(details, dict) else None)
    return header.get("result", {}), frame.body


class QuicPeerConnection:
    """One pinned connection to a peer; `call` may be used for many requests, concurrently."""

    def __init__(self, connection: OpenConnection) -> None:
        self._connection = connection

    async def call(self, method: str, params: dict[str, Any], body: Body = b"", *,
                   timeout_s: float = 30.0) -> tuple[dict[str, Any], bytes | bytearray]:
        """One request on its own stream; raises TransportError (reason says why)."""
        return await call_on(self._connection, method, params, body, timeout_s=timeout_s)

    async def round_trip_s(self, *, timeout_s: float = 1.0) -> float:
        """Seconds from a PING to its acknowledgement: the network's round trip to the peer, without
        the handshake or the work a call asks of it. Raises TimeoutError past `timeout_s`."""
        return await self._connection.protocol.ping_within(timeout_s)


@contextlib.asynccontextmanager
async def quic_connection(
    *, host: str, port: int, pin_sha256: str, settings: QuicSettings, timeout_s: float = 30.0
) -> AsyncIterator[QuicPeerConnection]:
    """Connect, check the certificate pin before sending anything, and yield the connection; on the way
    out it is closed at once and waits out its closing period in the background (close_soon)."""
    connection = await open_connection(host=host, port=port, pin_sha256=pin_sha256, settings=settings,
                                       timeout_s=timeout_s)
    try:
        yield QuicPeerConnection(connection)
    finally:
        connection.close_soon()


async def quic_call(
    *,
    host: str,
    port: int,
    pin_sha256: str,
    method: str,
    params: dict[str, Any],
    body: Body = b"",
    settings: QuicSettings,
    timeout_s: float = 30.0,
) -> tuple[dict[str, Any], bytes | bytearray]:
    """One request on a fresh connection; raises TransportError (reason says why)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with quic_connection(host=host, port=port, pin_sha256=pin_sha256, settings=settings,
                               timeout_s=timeout_s) as connection:
        remaining = max(0.001, deadline - asyncio.get_running_loop().time())
        return await connection.call(method, params, body, timeout_s=remaining)
