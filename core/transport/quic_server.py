"""Server side of the QUIC peer door: one request frame per stream, one async handler.

The server decodes one request frame per stream, admits it against its peer's
limits (admission.py), and hands it to one async handler that returns a Reply; the
handler's compute runs off the event loop (the handler's job), so this adapter only moves
bytes. It knows nothing of the methods it carries: which method a peer may call is the
worker's decision (apps/worker/doors.py).

A client that gives a request up (a hedge lost, a deadline passed) resets the stream
(RESET_STREAM + STOP_SENDING); the server then cancels that stream's handler task, so work
still queued for a compute thread is withdrawn rather than computed for nobody.

A node that stops drains its door (`PeerServer.drain`): a request that arrives from then on is
answered `shutting_down` at once (its router asks another holder, and a clean stop is not a
fault), the answers already being computed are finished and sent, and only then are the
connections closed; before, a SIGTERM closed them under the requests in flight, and each one
failed at its router as `connection_closed`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from core import metrics
from core.transport import quic_lib
from core.transport.admission import PeerAdmission, PeerLimits, PeerTable, peer_key
from core.transport.framing import KIND_REQUEST, Frame, FrameDecoder, FramingError, Reply, byte_view
from core.transport.lanes import MIN_LANE_BYTES
from core.transport.quic_config import QuicSettings
from core.transport.udp import tune_socket

# QUIC application error code sent with STOP_SENDING on a refused stream (any value works;
# the error frame already told the peer why).
_REFUSED_STREAM = 0x10
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerRequest:
    """One decoded request. `body` is the decoder's own buffer, handed over without a copy."""

    method: str
    params: dict[str, Any]
    body: bytes | bytearray = field(repr=False)
    peer: tuple[str, int]


ServerHandler = Callable[[PeerRequest], Awaitable[Reply]]
SHUTTING_DOWN = "shutting_down"
DRAIN_LINGER_S = 0.2  # after the last answer is handed to QUIC: time for its datagrams to leave


class _Drain:
    """Server-wide: whether new requests are refused, and every connection's answers in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.answering: set[asyncio.Task] = set()


class PeerServer:
    """The QUIC door: the library's server object, and its drain (the library's attributes pass through)."""

    def __init__(self, server: Any, drain: _Drain) -> None:
        self._server = server
        self._drain = drain

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def close(self) -> None:
        self._server.close()

    async def drain(self, timeout_s: float) -> int:
        """Refuse new requests (`shutting_down`) and wait up to `timeout_s` for the answers in flight
        to be computed and sent; how many were still unfinished (close() then cuts them)."""
        self._drain.draining = True
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0 and (
                pending := {t for t in self._drain.answering if not t.done()}):
            await asyncio.wait(pending, timeout=left)
        unfinished = sum(not t.done() for t in self._drain.answering)
        await asyncio.sleep(max(0.0, min(DRAIN_LINGER_S, deadline - time.monotonic())))
        return unfinished


class _ServerConnection(quic_lib.GuardedTransmit):
    """One server-side connection; mixed into the QUIC library's asyncio protocol class."""

    _quic: Any  # the library's QuicConnection (set by the protocol base class)

    def __init__(self, *args: Any, handler: ServerHandler, limits: PeerLimits,
                 peers: PeerTable, drain: _Drain, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handler = handler
        self._drain = drain
        self._limits = limits
        self._peers = peers  # every peer's connections, streams and bucket, shared by the server's connections
        self._host_key: str | None = None  # set once this connection is counted against its host
        self._admission_state: PeerAdmission | None = None
        self._decoders: dict[int, FrameDecoder] = {}
        self._requests: dict[int, Frame] = {}  # whole request frames waiting for their stream's FIN
        self._admitted: set[int] = set()  # streams holding an admission slot
        self._dropping: set[int] = set()  # streams already answered: their further bytes are ignored
        self._tasks: dict[int, asyncio.Task] = {}
        self._ended = False  # _release has run
        self._answer_coming = False  # this receive handed a whole request to the handler

    # -- events ------------------------------------------------------------------------------

    def quic_event_received(self, event: Any) -> None:
        events = self._lib.events
        if isinstance(event, events.StreamDataReceived):
            self._stream_data(event)
        elif isinstance(event, events.StreamReset | events.StopSendingReceived):
            # RESET_STREAM: the client stopped sending the request; STOP_SENDING: it no longer
            # wants the answer. Either way nobody will read what the handler computes.
            self._abandon(event.stream_id)
        elif isinstance(event, events.HandshakeCompleted):
            self._count_host()
        elif isinstance(event, events.ConnectionTerminated):
            self._release()

    def _release(self) -> None:
        """The connection ended: cancel its answers (nobody is left to read them), free its slots (once)."""
        if self._ended:
            return
        self._ended = True
        for task in list(self._tasks.values()):
            task.cancel()
        for stream_id in list(self._admitted):
            self._forget(stream_id)
        if self._admission_state is not None:
            self._admission_state.close()
        if self._host_key is not None:
            self._peers.disconnect(self._host_key)
            self._host_key = None

    def closed_by_library(self, why: str) -> None:
        """The library's core failed transmit after transmit (quic_lib.GuardedTransmit). The connection is ended
        as a ConnectionTerminated would end it, its timer stopped, and it is taken off the server's table,
        so the peer's further datagrams do not reach a core that fails; the peer's client sees its calls
        time out, drops the connection and opens a new one."""
        if self._ended:
            return
        logger.warning("QUIC connection from %s:%s %s: dropped", *self._peer(), why)
        self._release()
        timer = getattr(self, "_timer", None)
        if timer is not None:
            timer.cancel()
            self._timer = None
        self._connection_terminated_handler()  # the library's server forgets the connection's ids

    def _peer(self) -> tuple[str, int]:
        return self._lib.peer_address(self._quic) or ("?", 0)

    @property
    def _admission(self) -> PeerAdmission:
        # Made on first use: the peer's address is known once its first datagram arrived.
        if self._admission_state is None:
            self._admission_state = PeerAdmission(self._limits, now=time.monotonic(), table=self._peers,
                                                  host=self._peer()[0])
        return self._admission_state

    def _count_host(self) -> None:
        host = self._peer()[0]
        key = peer_key(host, ipv6_prefix=self._limits.ipv6_prefix)
        refusal = self._peers.connect(key, time.monotonic())
        if refusal is not None:
            logger.warning("refusing QUIC connection from %s: over %d connections from that host",
                           host, self._limits.max_connections_per_host)
            metrics.PEER_REFUSED.labels("quic", refusal.reason).inc()
            self._quic.close(error_code=0x2, reason_phrase="too many connections from this host")
            self.transmit_now()
            return
        self._host_key = key

    def _stream_data(self, event: Any) -> None:
        stream_id = event.stream_id
        if stream_id in self._dropping:
            if event.end_stream:
                self._dropping.discard(stream_id)
            return
        decoder = self._decoders.get(stream_id)
        if decoder is None:
            if self._drain.draining:
                metrics.PEER_REFUSED.labels("quic", SHUTTING_DOWN).inc()
                self._refuse(stream_id, Reply.error(SHUTTING_DOWN, "this node is stopping: ask another holder"),
                             ended=event.end_stream)
                return
            refusal = self._admission.admit(time.monotonic())
            if refusal is not None:
                metrics.PEER_REFUSED.labels("quic", refusal.reason).inc()
                self._refuse(stream_id, Reply.error(refusal.reason, refusal.message), ended=event.end_stream)
                return
            self._admitted.add(stream_id)
            decoder = self._decoders[stream_id] = FrameDecoder(max_body=self._limits.max_body,
                                                                      body_setting="TENZRO_PEER_MAX_BODY_BYTES")
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
            self._refuse(stream_id, Reply.error(exc.reason, str(exc), exc.details), ended=event.end_stream)

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

    def _abandon(self, stream_id: int) -> None:
        """The client gave the stream up: cancel its handler (withdrawing queued compute), free its slot."""
        self._dropping.discard(stream_id)
        task = self._tasks.pop(stream_id, None)
        if task is not None:
            task.cancel()
        self._forget(stream_id)

    def may_hold(self) -> bool:
        """Hold the ACK of a request that just arrived whole: its answer, when it comes within the hold,
        carries it (quic_lib.GuardedTransmit). Not while a request is half-received: its sender waits
        on those ACKs to send the rest."""
        coming, self._answer_coming = self._answer_coming, False
        return coming and not self._decoders

    def _start_answer(self, stream_id: int, frame: Frame) -> None:
        self._answer_coming = True
        task = asyncio.ensure_future(self._answer(stream_id, frame))
        self._tasks[stream_id] = task
        self._drain.answering.add(task)
        task.add_done_callback(lambda _: self._tasks.pop(stream_id, None))
        task.add_done_callback(self._drain.answering.discard)

    async def _answer(self, stream_id: int, frame: Frame) -> None:
        method, params = frame.header.get("method"), frame.header.get("params", {})
        if not isinstance(method, str) or not isinstance(params, dict):
            self._send(stream_id, Reply.error("bad_request",
                                              'request header needs "method" (string) and "params" (object)'))
            return
        try:
            reply = await self._handler(PeerRequest(method, params, frame.body, self._peer()))
        except asyncio.CancelledError:
            self._forget(stream_id)
            raise
        except Exception:
            logger.exception("QUIC handler for %s failed", method)
            reply = Reply.error("internal_error", f"internal error in {method}")
        self._send(stream_id, reply)

    def _with_window(self, reply: Reply) -> Reply:
        """`reply` with this connection's congestion window in its header (`window`, bytes) when its
        body is one a router may split over lanes (2 x MIN_LANE_BYTES or more): the answer of a
        multi-expert request is several times its request, and the window it goes out in is this
        side's, which the router cannot read off its own connection (core/transport/lanes.py)."""
        if len(byte_view(reply.body)) < 2 * MIN_LANE_BYTES:
            return reply
        window, _ = self._lib.path_state(self._quic)
        return reply if window is None else Reply({**reply.header, "window": int(window)}, reply.body)

    def _send(self, stream_id: int, reply: Reply) -> None:
        try:
            head, body = self._with_window(reply).encode_parts()
            # Header and body are queued separately: the library copies each into its send
            # buffer anyway, so joining them first would only copy the body once more.
            self._quic.send_stream_data(stream_id, head, end_stream=not len(body))
            if len(body):
                self._quic.send_stream_data(stream_id, body, end_stream=True)
            self.transmit_now()
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


@functools.cache
def _protocol_class(library: str) -> type:
    lib = quic_lib.load(library)
    return type(f"ServerProtocol[{library}]", (_ServerConnection, lib.protocol_class), {"_lib": lib})


async def start_server(
    *, host: str, port: int, cert_path: str, key_path: str, handler: ServerHandler, settings: QuicSettings,
    limits: PeerLimits | None = None,
) -> PeerServer:
    """Serve `handler` on host:port; every request is admitted against `limits` per peer.

    Returns the door: `close()` stops it, `drain()` first lets the answers in flight go out.
    """
    datagram_size = settings.datagram_size_on(host)
    configuration = settings.configuration(is_client=False, datagram_size=datagram_size)
    configuration.load_cert_chain(cert_path, key_path)
    limits = limits or PeerLimits(max_body=settings.max_body)
    peers = PeerTable(limits)
    drain = _Drain()
    protocol_class = _protocol_class(settings.library)

    def create_protocol(*args: Any, **kwargs: Any) -> Any:
        protocol = protocol_class(*args, handler=handler, limits=limits, peers=peers, drain=drain, **kwargs)
        protocol.ack_hold_s = settings.ack_hold_s
        return protocol

    serve = settings.lib.serve_batched if settings.batched_server and settings.lib.serve_batched else settings.lib.serve
    server = await serve(host, port, configuration=configuration, create_protocol=create_protocol)
    transport = getattr(server, "_transport", None)
    buffers = tune_socket(transport.get_extra_info("socket") if transport else None, settings.socket_buffer_bytes)
    logger.info("QUIC (%s %s) on %s:%d: datagrams of %d bytes, windows %d/%d, socket buffers %s",
                settings.library, settings.lib.version, host, port, datagram_size, settings.connection_window,
                settings.stream_window, buffers)
    return PeerServer(server, drain)
