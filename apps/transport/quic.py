"""asyncio adapter between aioquic and the framing of framing.py (ALPN `tenzro/moe`).

The server side decodes one request frame per stream, admits it against the connection's
peer limits (admission.py), and hands it to one async handler that returns a Reply; the
handler's compute runs off the event loop (the handler's job), so this adapter only moves
bytes. It knows nothing of the methods it carries: which method a peer may call is the
worker's decision (apps/worker/doors.py). The client side pins the server's certificate by
its SHA-256 fingerprint (the one in the server's signed provider record) instead of
trusting a CA.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.asyncio.server import QuicServer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, QuicEvent, StreamDataReceived, StreamReset
from cryptography.hazmat.primitives.serialization import Encoding

from apps.transport.admission import PeerAdmission, PeerLimits
from apps.transport.framing import KIND_REQUEST, KIND_RESPONSE, Frame, FrameDecoder, FramingError, Reply, request_frame
from apps.transport.pinning import certificate_sha256

ALPN = "tenzro/moe"
# QUIC application error code sent with STOP_SENDING on a refused stream (any value works;
# the error frame already told the peer why).
_REFUSED_STREAM = 0x10
logger = logging.getLogger(__name__)


class TransportError(Exception):
    """A QUIC call failed; `reason` says why (pin mismatch, timeout, remote error, …)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class PeerRequest:
    """One decoded request. `body` is the decoder's own buffer, handed over without a copy."""

    method: str
    params: dict[str, Any]
    body: bytes | bytearray = field(repr=False)
    peer: tuple[str, int]


ServerHandler = Callable[[PeerRequest], Awaitable[Reply]]


@dataclass(frozen=True)
class QuicSettings:
    max_body: int
    # Loopback and LANs carry far more than the 1,280-byte QUIC minimum; bigger datagrams
    # mean fewer packets, fewer ACKs and less per-packet crypto (see DESIGN.md measurements).
    max_datagram_size: int = 1350
    idle_timeout_s: float = 60.0


def _configuration(settings: QuicSettings, *, is_client: bool) -> QuicConfiguration:
    return QuicConfiguration(
        is_client=is_client,
        alpn_protocols=[ALPN],
        max_datagram_size=settings.max_datagram_size,
        idle_timeout=settings.idle_timeout_s,
        # The connection window also bounds what one peer can make the server buffer.
        max_data=64 * 1024 * 1024,
        max_stream_data=64 * 1024 * 1024,
    )


class _ServerProtocol(QuicConnectionProtocol):
    def __init__(self, *args: Any, handler: ServerHandler, limits: PeerLimits,
                 hosts: collections.Counter[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handler = handler
        self._limits = limits
        self._hosts = hosts  # connections per remote host, shared by every connection of the server
        self._host: str | None = None
        self._admission = PeerAdmission(limits, now=time.monotonic())
        self._decoders: dict[int, FrameDecoder] = {}
        self._requests: dict[int, Frame] = {}  # whole request frames waiting for their stream's FIN
        self._admitted: set[int] = set()  # streams holding an admission slot
        self._dropping: set[int] = set()  # streams already answered: their further bytes are ignored
        self._tasks: dict[int, asyncio.Task] = {}

    # -- events ------------------------------------------------------------------------------

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted):
            self._count_host()
        elif isinstance(event, StreamDataReceived):
            self._stream_data(event)
        elif isinstance(event, StreamReset):
            self._forget(event.stream_id)
        elif isinstance(event, ConnectionTerminated):
            for task in list(self._tasks.values()):
                task.cancel()  # nobody is left to read the answers
            for stream_id in list(self._admitted):
                self._forget(stream_id)
            if self._host is not None:
                self._hosts[self._host] -= 1
                self._host = None

    def _count_host(self) -> None:
        host = str(self._quic._network_paths[0].addr[0]) if self._quic._network_paths else "?"
        self._host = host
        self._hosts[host] += 1
        if self._hosts[host] > self._limits.max_connections_per_host:
            logger.warning("refusing QUIC connection from %s: over %d connections from that host",
                           host, self._limits.max_connections_per_host)
            self._quic.close(error_code=0x2, reason_phrase="too many connections from this host")
            self.transmit()

    def _stream_data(self, event: StreamDataReceived) -> None:
        stream_id = event.stream_id
        if stream_id in self._dropping:
            if event.end_stream:
                self._dropping.discard(stream_id)
            return
        decoder = self._decoders.get(stream_id)
        if decoder is None:
            refusal = self._admission.admit(time.monotonic())
            if refusal is not None:
                self._refuse(stream_id, Reply.error(refusal.reason, refusal.message), ended=event.end_stream)
                return
            self._admitted.add(stream_id)
            decoder = self._decoders[stream_id] = FrameDecoder(max_body=self._limits.max_body)
        try:
            for frame in decoder.feed(event.data):
                if stream_id in self._requests or frame.kind != KIND_REQUEST:
                    raise FramingError("a stream carries exactly one request frame")
                self._requests[stream_id] = frame
            if event.end_stream:
                decoder.finish()
                frame = self._requests.pop(stream_id, None)
                if frame is None:
                    raise FramingError("stream ended without a request", reason="truncated_frame")
                del self._decoders[stream_id]
                self._start_answer(stream_id, frame)
        except FramingError as exc:
            self._refuse(stream_id, Reply.error(exc.reason, str(exc)), ended=event.end_stream)

    def _refuse(self, stream_id: int, reply: Reply, *, ended: bool) -> None:
        """Answer now and ignore the rest of the stream; ask the peer to stop sending it."""
        self._decoders.pop(stream_id, None)
        if not ended:
            self._dropping.add(stream_id)
            try:
                self._quic.stop_stream(stream_id, _REFUSED_STREAM)
            except Exception:  # the stream's send side may already be finished
                logger.debug("stop_stream(%s) failed", stream_id, exc_info=True)
        self._send(stream_id, reply)

    def _start_answer(self, stream_id: int, frame: Frame) -> None:
        task = asyncio.ensure_future(self._answer(stream_id, frame))
        self._tasks[stream_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(stream_id, None))

    async def _answer(self, stream_id: int, frame: Frame) -> None:
        method, params = frame.header.get("method"), frame.header.get("params", {})
        if not isinstance(method, str) or not isinstance(params, dict):
            self._send(stream_id, Reply.error("bad_request",
                                              'request header needs "method" (string) and "params" (object)'))
            return
        peer = self._quic._network_paths[0].addr if self._quic._network_paths else ("?", 0)
        try:
            reply = await self._handler(PeerRequest(method, params, frame.body, (str(peer[0]), int(peer[1]))))
        except asyncio.CancelledError:
            self._forget(stream_id)
            raise
        except Exception:
            logger.exception("QUIC handler for %s failed", method)
            reply = Reply.error("internal_error", f"internal error in {method}")
        self._send(stream_id, reply)

    def _send(self, stream_id: int, reply: Reply) -> None:
        try:
            self._quic.send_stream_data(stream_id, reply.encode(), end_stream=True)
            self.transmit()
        except Exception:  # the stream or connection went away while we computed
            logger.debug("could not answer on stream %s", stream_id, exc_info=True)
        finally:
            self._forget(stream_id)

    def _forget(self, stream_id: int) -> None:
        self._decoders.pop(stream_id, None)
        self._requests.pop(stream_id, None)
        if stream_id in self._admitted:
            self._admitted.discard(stream_id)
            self._admission.release()


async def start_server(
    *, host: str, port: int, cert_path: str, key_path: str, handler: ServerHandler, settings: QuicSettings,
    limits: PeerLimits | None = None,
) -> QuicServer:
    """Serve `handler` on host:port; every request is admitted against `limits` per connection."""
    configuration = _configuration(settings, is_client=False)
    configuration.load_cert_chain(cert_path, key_path)
    limits = limits or PeerLimits(max_body=settings.max_body)
    hosts: collections.Counter[str] = collections.Counter()

    def create_protocol(*args: Any, **kwargs: Any) -> _ServerProtocol:
        return _ServerProtocol(*args, handler=handler, limits=limits, hosts=hosts, **kwargs)

    return await serve(host, port, configuration=configuration, create_protocol=create_protocol)


class _ClientProtocol(QuicConnectionProtocol):
    def __init__(self, *args: Any, max_body: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_body = max_body
        self._waiters: dict[int, tuple[FrameDecoder, asyncio.Future[Frame]]] = {}

    def peer_certificate_sha256(self) -> str | None:
        # aioquic keeps the verified-or-not peer certificate on its TLS context and has no
        # public accessor; we read it once the handshake is complete.
        certificate = getattr(self._quic.tls, "_peer_certificate", None)
        return None if certificate is None else certificate_sha256(certificate.public_bytes(Encoding.DER))

    async def call(self, method: str, params: dict[str, Any], body: bytes | memoryview) -> Frame:
        stream_id = self._quic.get_next_available_stream_id()
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiters[stream_id] = (FrameDecoder(max_body=self._max_body), future)
        self._quic.send_stream_data(stream_id, request_frame(method, params, body), end_stream=True)
        self.transmit()
        try:
            return await future
        finally:
            self._waiters.pop(stream_id, None)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            for _, future in self._waiters.values():
                if not future.done():
                    closed = TransportError("connection_closed", f"connection closed: {event.reason_phrase}")
                    future.set_exception(closed)
            return
        if not isinstance(event, StreamDataReceived) or event.stream_id not in self._waiters:
            return
        decoder, future = self._waiters[event.stream_id]
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
                future.set_result(frame)


class QuicPeerConnection:
    """One pinned connection to a peer; `call` may be used for many requests, concurrently."""

    def __init__(self, protocol: _ClientProtocol, where: str) -> None:
        self._protocol = protocol
        self._where = where

    async def call(self, method: str, params: dict[str, Any], body: bytes | memoryview = b"", *,
                   timeout_s: float = 30.0) -> tuple[dict[str, Any], bytes | bytearray]:
        """One request on its own stream; raises TransportError (reason says why)."""
        try:
            async with asyncio.timeout(timeout_s):
                frame = await self._protocol.call(method, params, body)
        except TimeoutError as exc:
            raise TransportError("timeout", f"no answer from {self._where} within {timeout_s} s") from exc
        header = frame.header
        if not header.get("ok"):
            error = header.get("error") or {}
            raise TransportError(error.get("reason", "remote_error"), error.get("message", "remote error"))
        return header.get("result", {}), frame.body


@contextlib.asynccontextmanager
async def quic_connection(
    *, host: str, port: int, pin_sha256: str, settings: QuicSettings, timeout_s: float = 30.0
) -> AsyncIterator[QuicPeerConnection]:
    """Connect, check the certificate pin before sending anything, and yield the connection."""
    configuration = _configuration(settings, is_client=True)
    # Trust comes from the pin below, not from a CA: the certificate is self-signed.
    configuration.verify_mode = ssl.CERT_NONE

    def create_protocol(*args: Any, **kwargs: Any) -> _ClientProtocol:
        return _ClientProtocol(*args, max_body=settings.max_body, **kwargs)

    where = f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout_s):
            opening = connect(host, port, configuration=configuration, create_protocol=create_protocol)
            client = await opening.__aenter__()
    except TimeoutError as exc:
        raise TransportError("timeout", f"no QUIC handshake with {where} within {timeout_s} s") from exc
    except ConnectionError as exc:
        raise TransportError("connection_failed", f"could not reach {where}: {exc}") from exc
    try:
        assert isinstance(client, _ClientProtocol)
        seen = client.peer_certificate_sha256()
        if seen is None or seen != pin_sha256.lower():
            raise TransportError("certificate_pin_mismatch",
                                 f"{where} presented certificate sha256 {seen}, expected {pin_sha256}")
        yield QuicPeerConnection(client, where)
    finally:
        await opening.__aexit__(None, None, None)


async def quic_call(
    *,
    host: str,
    port: int,
    pin_sha256: str,
    method: str,
    params: dict[str, Any],
    body: bytes | memoryview = b"",
    settings: QuicSettings,
    timeout_s: float = 30.0,
) -> tuple[dict[str, Any], bytes | bytearray]:
    """One request on a fresh connection; raises TransportError (reason says why)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with quic_connection(host=host, port=port, pin_sha256=pin_sha256, settings=settings,
                               timeout_s=timeout_s) as connection:
        remaining = max(0.001, deadline - asyncio.get_running_loop().time())
        return await connection.call(method, params, body, timeout_s=remaining)
