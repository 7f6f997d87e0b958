"""QuicPool against real QUIC servers on loopback, with each library: reuse, reconnects, pins,
timeouts, idle close, and cancellation reaching the server's handler."""

import asyncio
import concurrent.futures
import contextlib
import gc
import socket
import threading
import time

import pytest

from apps.node.identity import load_or_create_identity
from core.transport.framing import Reply
from core.transport.pool import QuicPool
from core.transport.quic import PeerRequest, QuicSettings, TransportError, quic_connection, start_server
from testkit.netem import Impairment, UdpRelay

pytestmark = pytest.mark.parametrize("library", ["qh3", "aioquic"])


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """A real QUIC server in this event loop with a handler that records what it saw."""

    def __init__(self, identity, library: str, port: int | None = None, **settings) -> None:
        self.identity, self.library, self.settings = identity, library, settings
        self.port = port or _free_udp_port()
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.handler_started = asyncio.Event()
        self.handler_cancelled = asyncio.Event()
        self._server = None

    async def handle(self, request: PeerRequest) -> Reply:
        self.started.append(request.method)
        self.handler_started.set()
        try:
            if request.method == "fail":
                return Reply.error("expert_not_loaded", "expert 7 is not loaded here", {"expert": 7})
            if request.method == "slow":
                await asyncio.sleep(float(request.params["s"]))
            if request.method == "big":  # an answer of n bytes to a request of any size
                return Reply.ok({}, bytes(int(request.params["n"])))
            return Reply.ok({"n": request.params.get("n")}, bytes(request.body)[::-1])
        except asyncio.CancelledError:
            self.cancelled.append(request.method)
            self.handler_cancelled.set()
            raise

    async def start(self) -> "Server":
        self._server = await start_server(
            host="127.0.0.1", port=self.port, cert_path=str(self.identity.cert_path),
            key_path=str(self.identity.cert_key_path), handler=self.handle,
            settings=QuicSettings(max_body=1 << 24, library=self.library, **self.settings))
        return self

    def stop(self) -> None:
        self._server.close()


def _pool(library: str, **kwargs) -> QuicPool:
    return QuicPool(QuicSettings(max_body=1 << 24, library=library), **kwargs)


def _call(pool: QuicPool, server: Server, method: str = "echo", *, pin: str | None = None, timeout_s: float = 10,
          **kwargs):
    return pool.call(host="127.0.0.1", port=server.port, pin_sha256=pin or server.identity.cert_sha256,
                     method=method, timeout_s=timeout_s, **kwargs)


def test_concurrent_calls_share_one_connection_and_one_handshake(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            bodies = [bytes([i]) * (1000 * (i + 1)) for i in range(16)]
            answers = await asyncio.gather(*(_call(pool, server, params={"n": i}, body=body)
                                             for i, body in enumerate(bodies)))
            for i, (result, reply) in enumerate(answers):
                assert result == {"n": i}
                assert bytes(reply) == bodies[i][::-1]
            return pool.stats()
        finally:
            await pool.close()
            server.stop()

    stats = asyncio.run(scenario())
    assert stats["handshakes"] == 1 and stats["open_connections"] == 1 and stats["reconnects"] == 0
    assert stats["calls"] == 16 and stats["failures"] == 0 and stats["in_flight"] == 0


def test_a_server_restart_on_the_same_port_is_followed_by_a_reconnect(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            await _call(pool, server, params={"n": 1})
            server.stop()  # a clean stop: CONNECTION_CLOSE reaches the pooled connection
            await asyncio.sleep(0.2)
            server = await Server(identity, library, port=server.port).start()
            result, _ = await _call(pool, server, params={"n": 2})
            assert result == {"n": 2}
            return pool.stats()
        finally:
            await pool.close()
            server.stop()

    stats = asyncio.run(scenario())
    assert stats["handshakes"] == 2 and stats["reconnects"] == 1 and stats["open_connections"] == 1


def test_a_peer_that_vanished_without_a_word_is_reconnected_to_after_a_timeout(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            await _call(pool, server, params={"n": 1})
            # A crash: the socket goes away without a CONNECTION_CLOSE, so the client is not told.
            server._server._transport.close()
            with pytest.raises(TransportError) as info:
                await _call(pool, server, timeout_s=1.0, params={"n": 2})
            assert info.value.reason == "timeout"
            server = await Server(identity, library, port=server.port).start()
            result, _ = await _call(pool, server, params={"n": 3})
            assert result == {"n": 3}
            return pool.stats()
        finally:
            await pool.close()
            server.stop()

    stats = asyncio.run(scenario())
    assert stats["reconnects"] == 1 and stats["failures"] == 1


def test_a_peer_restarted_under_calls_raced_out_unanswered_is_reconnected_to(identity, library) -> None:
    # A holder SIGKILLed and started again on the same port: the new process ignores the old
    # connection's packets. The router's calls to it are raced out by backups (cancelled, never timing
    # out); each leaves the connection suspect, a PING goes unanswered, and the next call reconnects.
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            await _call(pool, server, params={"n": 1})
            server._server._transport.close()  # a crash: no CONNECTION_CLOSE
            await asyncio.sleep(0.2)  # the socket is closed by the loop
            server = await Server(identity, library, port=server.port).start()
            for n in range(3):  # a backup wins after 50 ms, each time
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await _call(pool, server, params={"n": n})
            await asyncio.sleep(1.5)  # the PING's verdict
            result, _ = await _call(pool, server, params={"n": 9}, timeout_s=5)
            assert result == {"n": 9}
            return pool.stats()
        finally:
            await pool.close()
            server.stop()

    stats = asyncio.run(scenario())
    assert stats["reconnects"] == 1 and stats["cancelled_streams"] >= 1, stats


def test_a_slow_peer_is_heard_from_and_a_hung_one_is_not(identity, library) -> None:
    """What tells a holder raced out while still working (its ACKs come back) from a hung one."""
    async def scenario():
        server = await Server(identity, library).start()
        relay = UdpRelay(listen=("127.0.0.1", 0), target=("127.0.0.1", server.port), impairment=Impairment()).start()
        pool = _pool(library)
        peer = {"host": "127.0.0.1", "port": relay.listen[1], "pin_sha256": server.identity.cert_sha256}
        heard = {}
        try:
            await pool.call(**peer, method="echo", params={"n": 1}, timeout_s=10)
            for case in ("slow", "hung"):
                if case == "hung":
                    relay.impairment = Impairment(loss=1.0)  # nothing gets through any more, either way
                    await asyncio.sleep(0.05)
                since = time.monotonic()
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):  # raced out while the handler still sleeps
                        await pool.call(**peer, method="slow", params={"s": 1.0}, timeout_s=10)
                heard[case] = pool.heard_since(**peer, since=since)
            heard["unknown peer"] = pool.heard_since(host="127.0.0.1", port=1, pin_sha256="ab", since=0.0)
        finally:
            await pool.close()
            relay.close()
            server.stop()
        return heard

    assert asyncio.run(scenario()) == {"slow": True, "hung": False, "unknown peer": False}


def test_a_wrong_pin_is_refused_before_any_request(identity, library, tmp_path) -> None:
    other = load_or_create_identity(tmp_path / "other")

    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            with pytest.raises(TransportError) as info:
                await _call(pool, server, pin=other.cert_sha256, params={})
            return info.value.reason, server.started, pool.stats()
        finally:
            await pool.close()
            server.stop()

    reason, started, stats = asyncio.run(scenario())
    assert reason == "certificate_pin_mismatch"
    assert started == []
    assert stats["open_connections"] == 0 and stats["failures"] == 1


def test_remote_errors_keep_their_reason_and_the_connection(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            with pytest.raises(TransportError) as info:
                await _call(pool, server, "fail", params={})
            assert info.value.details == {"expert": 7}
            await _call(pool, server, params={"n": 1})
            return info.value.reason, pool.stats()
        finally:
            await pool.close()
            server.stop()

    reason, stats = asyncio.run(scenario())
    assert reason == "expert_not_loaded"
    assert stats["handshakes"] == 1 and stats["failures"] == 1


def test_a_timeout_resets_the_stream_and_the_server_stops_working_on_it(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            with pytest.raises(TransportError) as info:
                await _call(pool, server, "slow", params={"s": 30}, timeout_s=0.5)
            await asyncio.wait_for(server.handler_cancelled.wait(), 5)
            result, _ = await _call(pool, server, params={"n": 2})  # the connection is still good
            return info.value.reason, result, pool.stats()
        finally:
            await pool.close()
            server.stop()

    reason, result, stats = asyncio.run(scenario())
    assert reason == "timeout" and result == {"n": 2}
    assert stats["cancelled_streams"] == 1 and stats["handshakes"] == 1


def test_cancelling_a_call_cancels_the_servers_handler(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            call = asyncio.ensure_future(_call(pool, server, "slow", params={"s": 30}))
            await asyncio.wait_for(server.handler_started.wait(), 5)
            call.cancel()  # e.g. the hedge that lost
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.wait_for(server.handler_cancelled.wait(), 5)
            return server.cancelled, pool.stats()
        finally:
            await pool.close()
            server.stop()

    cancelled, stats = asyncio.run(scenario())
    assert cancelled == ["slow"]
    assert stats["cancelled_streams"] == 1 and stats["failures"] == 0


def test_a_cancelled_call_withdraws_compute_still_queued_on_the_server(identity, library) -> None:
    """The server's handler queues compute on a one-thread executor, as the worker does; a
    call cancelled while its job waits in the queue must never run that job."""
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    ran: list[str] = []
    release = threading.Event()

    def compute(name: str) -> str:
        if name == "first":
            release.wait(10)
        ran.append(name)
        return name

    async def scenario():
        server = Server(identity, library)

        async def handle(request: PeerRequest) -> Reply:
            name = await asyncio.get_running_loop().run_in_executor(executor, compute, request.params["name"])
            return Reply.ok({"name": name})

        server.handle = handle
        await server.start()
        pool = _pool(library)
        try:
            first = asyncio.ensure_future(_call(pool, server, "compute", params={"name": "first"}))
            second = asyncio.ensure_future(_call(pool, server, "compute", params={"name": "second"}))
            await asyncio.sleep(0.5)  # both requests reached the server; "second" waits for the thread
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            await asyncio.sleep(0.3)  # the STOP_SENDING reaches the server
            release.set()
            assert (await first)[0] == {"name": "first"}
            await asyncio.sleep(0.2)
        finally:
            await pool.close()
            server.stop()

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        executor.shutdown(wait=True)
    assert ran == ["first"]


def test_idle_connections_are_closed_and_reopened_on_demand(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library, idle_close_s=0.3)
        try:
            await _call(pool, server, params={"n": 1})
            deadline = time.monotonic() + 5
            while pool.stats()["open_connections"] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            idle = pool.stats()
            await _call(pool, server, params={"n": 2})
            return idle, pool.stats()
        finally:
            await pool.close()
            server.stop()

    idle, after = asyncio.run(scenario())
    assert idle["open_connections"] == 0
    assert after["open_connections"] == 1 and after["reconnects"] == 1


def test_a_quiet_connection_is_kept_past_quics_idle_timeout_by_pings(identity, library) -> None:
    """Both ends time a connection out after idle_timeout_s without a datagram; the pool keeps one it has
    not closed for idleness alive with PINGs, so the call after a quiet spell needs no new handshake."""
    async def scenario():
        server = await Server(identity, library, idle_timeout_s=0.6).start()
        pool = QuicPool(QuicSettings(max_body=1 << 20, library=library, idle_timeout_s=0.6), idle_close_s=30)
        try:
            await _call(pool, server, params={"n": 1})
            await asyncio.sleep(2.0)  # over three idle timeouts without a call
            await _call(pool, server, params={"n": 2})
            return pool.stats()
        finally:
            await pool.close()
            server.stop()

    stats = asyncio.run(scenario())
    assert stats["handshakes"] == 1 and stats["reconnects"] == 0 and stats["failures"] == 0
    assert stats["keepalive_pings"] >= 3


def test_nobody_listening_fails_cleanly(identity, library) -> None:
    async def scenario():
        pool = QuicPool(QuicSettings(max_body=1 << 20, library=library), connect_timeout_s=1.0)
        try:
            with pytest.raises(TransportError) as info:
                await pool.call(host="127.0.0.1", port=_free_udp_port(), pin_sha256=identity.cert_sha256,
                                method="echo", params={}, timeout_s=3)
            return info.value.reason
        finally:
            await pool.close()

    assert asyncio.run(scenario()) in {"timeout", "connection_failed"}


def test_a_connection_the_library_closed_itself_is_dropped_and_the_next_call_reconnects(identity, library) -> None:
    """A connection that closed itself (a protocol error it detected: qh3 did so under loss, on a
    peer's FinalSizeSmallerThanReceived) before its ConnectionTerminated event was handled refuses
    sends with the library's QuicConnectionError: the call fails as connection_closed, not as an
    unexpected exception, and the pool opens a new connection for the next one."""
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            await _call(pool, server, params={"n": 1})
            (pooled,) = pool._pooled.values()
            quic = pooled.connection.protocol._quic
            quic.close(error_code=0x1, reason_phrase="protocol violation seen")  # no event handled yet
            with pytest.raises(TransportError) as failure:
                await _call(pool, server, params={"n": 2})
            assert failure.value.reason == "connection_closed"
            result, _ = await _call(pool, server, params={"n": 3})
            assert result == {"n": 3}
            return pool.stats()
        finally:
            await pool.close()
            server.stop()

    stats = asyncio.run(scenario())
    assert stats["handshakes"] == 2 and stats["open_connections"] == 1


@contextlib.asynccontextmanager
async def _served(identity, library: str):
    """A server, a pool, and what reached the loop's exception handler (a traceback the loop logged)."""
    server = await Server(identity, library).start()
    pool = _pool(library)
    escaped: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: escaped.append(context))
    try:
        yield server, pool, escaped
    finally:
        await pool.close()
        server.stop()


def _fail_transmits(protocol, times: int | None = None) -> None:
    """Make the library's core raise from the next `times` transmits (all of them if None), as qh3's does
    ("packet builder capacity exhausted")."""
    error, original = protocol._lib.connection_error, protocol._quic.datagrams_to_send
    left = [times]

    def failing(*args, **kwargs):
        if left[0] == 0:
            return original(*args, **kwargs)
        if left[0] is not None:
            left[0] -= 1
        if protocol._lib.name == "qh3":
            raise error(1, 0, "packet builder capacity exhausted")
        raise error(error_code=1, frame_type=0, reason_phrase="packet builder capacity exhausted")

    protocol._quic.datagrams_to_send = failing


def test_a_connection_the_librarys_core_fails_in_a_timer_is_dropped_not_left_half_dead(identity, library) -> None:
    # qh3's packet core can raise from a timer's transmit: retried, and when it keeps failing the
    # connection is closed as if the peer had closed it, no traceback escapes to the loop, and the
    # next call reconnects.
    async def scenario():
        async with _served(identity, library) as (server, pool, escaped):
            loop = asyncio.get_running_loop()
            await _call(pool, server, params={"n": 1})
            protocol = next(iter(pool._pooled.values())).connection.protocol
            original = protocol._quic.datagrams_to_send
            _fail_transmits(protocol)
            loop.call_soon(protocol.transmit)  # as the library's timer calls it
            await asyncio.sleep(0.5)
            assert protocol.terminated is None  # still being retried
            await asyncio.sleep(1.0)
            protocol._quic.datagrams_to_send = original  # so that closing the dropped connection ends
            assert protocol.terminated and "capacity exhausted" in protocol.terminated
            result, _ = await _call(pool, server, params={"n": 2})
            assert result == {"n": 2} and escaped == []
            return pool.stats()

    stats = asyncio.run(scenario())
    assert stats["reconnects"] == 1, stats


def test_a_server_connection_whose_librarys_core_fails_is_dropped_and_the_client_reconnects(identity, library) -> None:
    # The same failure, lasting, on the server's side of a connection (seen from the timer of a
    # connection whose peer had restarted): no traceback escapes to the loop, the connection leaves the
    # library's server table with its timer stopped, and the client's next calls get through on
    # a new connection once its pool has found the old one silent.
    async def scenario():
        async with _served(identity, library) as (server, pool, escaped):
            loop = asyncio.get_running_loop()
            await _call(pool, server, params={"n": 1})
            table = server._server._protocols
            (protocol,) = set(table.values())
            _fail_transmits(protocol)
            loop.call_soon(protocol.transmit)  # as the library's timer calls it
            await asyncio.sleep(1.5)
            assert protocol not in table.values() and protocol._timer is None
            with pytest.raises(TransportError) as silent:
                await _call(pool, server, params={"n": 2}, timeout_s=0.5)
            assert silent.value.reason == "timeout"
            result, _ = await _call(pool, server, params={"n": 3})
            assert result == {"n": 3} and escaped == []
            return pool.stats()

    stats = asyncio.run(scenario())
    assert stats["reconnects"] == 1, stats


def test_a_transmit_the_librarys_core_fails_a_few_times_is_retried_and_the_connection_kept(identity, library) -> None:
    # qh3's server fails some transmits and succeeds a moment later (every handshake with an
    # aioquic client): the answer still arrives, on the same connection, and nothing is logged at ERROR.
    async def scenario():
        async with _served(identity, library) as (server, pool, escaped):
            await _call(pool, server, params={"n": 1})
            (protocol,) = set(server._server._protocols.values())
            _fail_transmits(protocol, times=3)
            result, reply = await _call(pool, server, params={"n": 2}, body=b"abc")
            assert (result, bytes(reply)) == ({"n": 2}, b"cba") and escaped == []
            assert protocol._failing_since is None and protocol in server._server._protocols.values()
            return pool.stats()

    stats = asyncio.run(scenario())
    assert stats["handshakes"] == 1 and stats["reconnects"] == 0, stats


def _count_datagrams(protocol, counts: dict[str, int], side: str) -> None:
    original = protocol._quic.datagrams_to_send

    def counting(*args, **kwargs):
        out = original(*args, **kwargs)
        counts[side] += len(out)
        return out

    protocol._quic.datagrams_to_send = counting


def test_acks_and_stream_credit_ride_on_the_next_request_and_answer_within_the_hold(identity, library) -> None:
    # One small call every 5 ms, as a router calls a holder layer after layer: with the sends a
    # received datagram prompts held (ACKs, stream credit), a call on qh3 costs its request and its
    # answer and little else (2.2 datagrams measured; aioquic 3.1); without, 6 (aioquic 4).
    async def scenario(hold_s: float) -> float:
        server = await Server(identity, library, ack_hold_s=hold_s).start()
        pool = _pool(library) if hold_s else QuicPool(QuicSettings(max_body=1 << 24, library=library, ack_hold_s=0.0))
        try:
            await _call(pool, server, params={"n": 0}, body=b"x" * 4000)
            counts = {"client": 0, "server": 0}
            _count_datagrams(next(iter(pool._pooled.values())).connection.protocol, counts, "client")
            _count_datagrams(next(iter(set(server._server._protocols.values()))), counts, "server")
            calls = 30
            for n in range(calls):
                result, reply = await _call(pool, server, params={"n": n}, body=b"x" * 4000)
                assert result == {"n": n} and bytes(reply) == b"x" * 4000
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.1)  # what was still held has gone
            return (counts["client"] + counts["server"]) / calls
        finally:
            await pool.close()
            server.stop()

    # A loaded machine (CI beside other processes) can stall a call past the hold, which sends
    # the held datagrams on their own: the best of up to three rounds is what holding allows, and
    # sending at once never reaches it in any round.
    bound = 2.5 if library == "qh3" else 3.3
    rounds_held: list[float] = []
    while len(rounds_held) < 3 and (not rounds_held or min(rounds_held) > bound):
        rounds_held.append(asyncio.run(scenario(0.02)))
    at_once = asyncio.run(scenario(0.0))
    assert min(rounds_held) <= bound and at_once >= 3.8, (rounds_held, at_once)


def test_a_held_ack_still_goes_when_the_answer_takes_longer_than_the_hold(identity, library) -> None:
    # A request whose answer takes 150 ms is ACKed within the hold (20 ms), not when it is answered:
    # the client's loss detection and the pool's liveness check see the peer alive.
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            await _call(pool, server, params={"n": 0})
            protocol = next(iter(pool._pooled.values())).connection.protocol
            sent_at = time.monotonic()
            call = asyncio.ensure_future(_call(pool, server, "slow", params={"s": 0.15}))
            await asyncio.sleep(0.09)
            acked_at = protocol.last_received
            await call
            return acked_at - sent_at
        finally:
            await pool.close()
            server.stop()

    assert 0 < asyncio.run(scenario()) < 0.09


def test_a_ping_given_up_on_leaves_no_unretrieved_future(identity, library) -> None:
    """A PING past its timeout (the peer went silent): the library shields its waiter from the
    cancel, and the connection's end later fails it; that end is retrieved, not logged at ERROR as
    "Future exception was never retrieved"."""
    unretrieved: list[str] = []

    async def scenario():
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unretrieved.append(context["message"]))
        server = await Server(identity, library).start()
        relay = UdpRelay(listen=("127.0.0.1", 0), target=("127.0.0.1", server.port), impairment=Impairment()).start()
        settings = QuicSettings(max_body=1 << 20, library=library)
        async with quic_connection(host="127.0.0.1", port=relay.listen[1], pin_sha256=identity.cert_sha256,
                                   settings=settings, timeout_s=5) as connection:
            assert 0 < await connection.round_trip_s(timeout_s=2) < 2  # answered: a round trip
            relay.impairment = Impairment(loss=1.0)  # the peer is silent from now on
            with pytest.raises(TimeoutError):
                await connection.round_trip_s(timeout_s=0.2)
        relay.close()
        server.stop()
        await asyncio.sleep(0.1)
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(scenario())
    gc.collect()
    assert unretrieved == []
