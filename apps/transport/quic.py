"""asyncio adapter between aioquic and the framing of framing.py (ALPN `tenzro/moe`).

The server side decodes one request frame per stream and hands it to an async handler;
the handler's compute runs off the event loop (the handler's job), so this adapter only
moves bytes. The client side pins the server's certificate by its SHA-256 fingerprint
(the one in the server's signed provider record) instead of trusting a CA.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.asyncio.server import QuicServer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamDataReceived
from cryptography.hazmat.primitives.serialization import Encoding

from apps.node.identity import certificate_sha256
from apps.transport.framing import (
    KIND_REQUEST,
    KIND_RESPONSE,
    Frame,
    FrameDecoder,
    FramingError,
    error_frame,
    request_frame,
    response_frame,
)

ALPN = "tenzro/moe"
logger = logging.getLogger(__name__)

# (method, params, body) -> (result, body). Raise HandlerError for an application error.
Handler = Callable[[str, dict[str, Any], bytes], Awaitable[tuple[dict[str, Any], bytes]]]


class HandlerError(Exception):
    """An error a handler reports to the remote caller with a machine-readable reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class TransportError(Exception):
    """A QUIC call failed; `reason` says why (pin mismatch, timeout, remote error, …)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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
        max_data=64 * 1024 * 1024,
        max_stream_data=64 * 1024 * 1024,
    )


class _ServerProtocol(QuicConnectionProtocol):
    def __init__(self, *args: Any, handler: Handler, max_body: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handler = handler
        self._max_body = max_body
        self._decoders: dict[int, FrameDecoder] = {}
        self._requests: dict[int, Frame] = {}
        self._tasks: set[asyncio.Task] = set()

    def quic_event_received(self, event: QuicEvent) -> None:
        if not isinstance(event, StreamDataReceived):
            return
        stream_id = event.stream_id
        decoder = self._decoders.setdefault(stream_id, FrameDecoder(max_body=self._max_body))
        try:
            for frame in decoder.feed(event.data):
                if stream_id in self._requests or frame.kind != KIND_REQUEST:
                    raise FramingError("a stream carries exactly one request frame")
                self._requests[stream_id] = frame
            if event.end_stream:
                decoder.finish()
                if stream_id not in self._requests:
                    raise FramingError("stream ended without a request", reason="truncated_frame")
        except FramingError as exc:
            self._decoders.pop(stream_id, None)
            self._requests.pop(stream_id, None)
            self._reply(stream_id, error_frame(exc.reason, str(exc)))
            return
        if event.end_stream:
            del self._decoders[stream_id]
            task = asyncio.ensure_future(self._answer(stream_id, self._requests.pop(stream_id)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, stream_id: int, frame: Frame) -> None:
        method, params = frame.header.get("method"), frame.header.get("params", {})
        if not isinstance(method, str) or not isinstance(params, dict):
            message = 'request header needs "method" (string) and "params" (object)'
            self._reply(stream_id, error_frame("bad_request", message))
            return
        try:
            result, body = await self._handler(method, params, bytes(frame.body))
            data = response_frame(result, body)
        except HandlerError as exc:
            data = error_frame(exc.reason, exc.message)
        except Exception:
            logger.exception("QUIC handler for %s failed", method)
            data = error_frame("internal_error", f"internal error in {method}")
        self._reply(stream_id, data)

    def _reply(self, stream_id: int, data: bytes) -> None:
        try:
            self._quic.send_stream_data(stream_id, data, end_stream=True)
        except Exception:  # the stream or connection went away while we computed
            logger.debug("could not answer on stream %s", stream_id, exc_info=True)
            return
        self.transmit()


async def start_server(
    *, host: str, port: int, cert_path: str, key_path: str, handler: Handler, settings: QuicSettings
) -> QuicServer:
    configuration = _configuration(settings, is_client=False)
    configuration.load_cert_chain(cert_path, key_path)

    def create_protocol(*args: Any, **kwargs: Any) -> _ServerProtocol:
        return _ServerProtocol(*args, handler=handler, max_body=settings.max_body, **kwargs)

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

    async def call(self, method: str, params: dict[str, Any], body: bytes) -> Frame:
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


async def quic_call(
    *,
    host: str,
    port: int,
    pin_sha256: str,
    method: str,
    params: dict[str, Any],
    body: bytes = b"",
    settings: QuicSettings,
    timeout_s: float = 30.0,
) -> tuple[dict[str, Any], bytes | bytearray]:
    """One request on a fresh connection; raises TransportError (reason says why)."""
    configuration = _configuration(settings, is_client=True)
    # Trust comes from the pin below, not from a CA: the certificate is self-signed.
    configuration.verify_mode = ssl.CERT_NONE

    def create_protocol(*args: Any, **kwargs: Any) -> _ClientProtocol:
        return _ClientProtocol(*args, max_body=settings.max_body, **kwargs)

    try:
        async with asyncio.timeout(timeout_s):
            async with connect(host, port, configuration=configuration, create_protocol=create_protocol) as client:
                assert isinstance(client, _ClientProtocol)
                seen = client.peer_certificate_sha256()
                if seen is None or seen != pin_sha256.lower():
                    client.close()
                    raise TransportError(
                        "certificate_pin_mismatch",
                        f"{host}:{port} presented certificate sha256 {seen}, expected {pin_sha256}",
                    )
                frame = await client.call(method, params, body)
    except TimeoutError as exc:
        raise TransportError("timeout", f"no answer from {host}:{port} within {timeout_s} s") from exc
    except ConnectionError as exc:
        raise TransportError("connection_failed", f"could not reach {host}:{port}: {exc}") from exc
    header = frame.header
    if not header.get("ok"):
        error = header.get("error") or {}
        raise TransportError(error.get("reason", "remote_error"), error.get("message", "remote error"))
    return header.get("result", {}), frame.body
