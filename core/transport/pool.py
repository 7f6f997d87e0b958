"""A pool of pinned QUIC client connections: one per (host, port, pin, lane), many calls on each.

The distributed forward calls many peers, many times a second; a handshake per call would
cost a round trip and a certificate check each. The pool opens one connection per peer
lazily (concurrent first calls share its one handshake), multiplexes every call on its own
stream, and notices a connection that died — closed by the peer, idle-timed out, silent
through a whole call, or deaf to a PING after a call that timed out or was cancelled unanswered
(a peer restarted on the same address ignores the old connection) — so the next call
reconnects. Cancelling a call's task resets its stream (quic_client.py), which makes the server
cancel the work.

Lane 0 is a peer's connection. A caller with a request larger than that connection's congestion
window asks `lanes_for` which lanes it may split it over (core/transport/lanes.py decides how many):
the lanes open now, while the missing ones open in the background for the next request, so no
handshake is ever on a request's way.

The pool belongs to one event loop (the one its first call ran on). It knows nothing of
what it carries: methods, params and bodies are the caller's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from core.transport.framing import Body
from core.transport.lanes import MIN_LANE_BYTES, LanePolicy
from core.transport.quic_client import OpenConnection, open_connection, result_of
from core.transport.quic_config import QuicSettings, TransportError

logger = logging.getLogger(__name__)
Key = tuple[str, int, str, int]  # host, port, certificate pin (lowercase hex), lane
# After a call timed out, or was cancelled with nothing heard back: how long the peer has to
# acknowledge a PING before its connection is dropped. Any live peer acknowledges within a few
# round trips, whatever its handler is doing.
PING_TIMEOUT_S = 1.0
# A lane that did not open, or died, is not tried again for this long: a peer refusing more
# connections from this host (its door's limit) must not see a handshake for every large request.
LANE_RETRY_S = 30.0
# How long a new lane has to acknowledge its first PING (it is not on any request's way).
LANE_PROOF_TIMEOUT_S = 3.0


@dataclass
class _Pooled:
    connection: OpenConnection
    # Calls in flight are bounded below the server's per-connection stream limit (peer door:
    # TENZRO_PEER_MAX_STREAMS, 32), so a burst waits here instead of being refused there.
    slots: asyncio.Semaphore
    last_used: float = field(default_factory=time.monotonic)
    checking: asyncio.Task[None] | None = None  # the liveness check after a timed-out call
    keeping: asyncio.Task[None] | None = None  # the keep-alive PING of a connection that is quiet (_reap)
    lanes: LanePolicy | None = None  # lane 0's: how many lanes this peer's large requests take
    # Answered a PING or a call: a door over its connection limit closes a new connection right
    # after its handshake, so a lane opened in the background is offered only once proven.
    proven: bool = True

    @property
    def alive(self) -> bool:
        return self.connection.protocol.terminated is None

    @property
    def busy(self) -> bool:
        return self.connection.protocol.in_flight > 0


class QuicPool:
    """Pinned QUIC connections shared by every call to the same peer.

    `call` raises TransportError with a reason: `timeout`, `connection_failed`,
    `connection_closed`, `certificate_pin_mismatch`, or the remote error's own reason.
    """

    def __init__(self, settings: QuicSettings, *, connect_timeout_s: float = 5.0, idle_close_s: float = 60.0,
                 max_streams_per_connection: int = 32) -> None:
        self._settings = settings
        self._connect_timeout_s = connect_timeout_s
        self._idle_close_s = idle_close_s
        self._max_streams = max_streams_per_connection
        self._pooled: dict[Key, _Pooled] = {}
        self._opening: dict[Key, asyncio.Task[_Pooled]] = {}
        self._ever_opened: set[Key] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._warming: set[asyncio.Task[None]] = set()  # lanes opening for the next large request
        self._lane_retry_at: dict[Key, float] = {}  # lanes that failed: not opened again before then
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self._counts: collections.Counter[str] = collections.Counter()

    async def call(self, *, host: str, port: int, pin_sha256: str, method: str, params: dict[str, Any],
                   body: Body = b"", timeout_s: float, lane: int = 0) -> tuple[dict[str, Any], bytes | bytearray]:
        """One request on its own stream of the peer's pooled connection (its `lane`th), within
        `timeout_s` in all."""
        if self._closed:
            raise TransportError("connection_closed", "the QUIC pool is closed")
        self._counts["calls"] += 1
        self._start_reaper()
        key = (host, port, pin_sha256.lower(), lane)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pooled: _Pooled | None = None
        sent_at = 0.0
        try:
            async with asyncio.timeout_at(deadline):
                frame = None
                while frame is None:
                    pooled = await self._connection(key)
                    async with pooled.slots:
                        if not pooled.alive:  # it died while we waited for a slot: nothing sent yet, reconnect
                            continue
                        pooled.last_used = sent_at = time.monotonic()
                        try:
                            frame = await pooled.connection.protocol.call(method, params, body)
                        except asyncio.CancelledError:  # our caller gave up, or the deadline hit: stream reset
                            self._counts["cancelled_streams"] += 1
                            if pooled.connection.protocol.last_received < sent_at:
                                # Raced out by a backup with not even an ACK back: a peer restarted
                                # under the same address ignores the old connection's packets, and
                                # every call would be raced out the same way until the idle timeout.
                                self._check_soon(key, pooled)
                            raise
                        finally:
                            pooled.last_used = time.monotonic()
            pooled.proven = True
            return result_of(frame)
        except TimeoutError as exc:
            self._counts["failures"] += 1
            if pooled is not None and sent_at:
                self._suspect(key, pooled, sent_at)
            raise TransportError("timeout", f"no answer from {host}:{port} within {timeout_s} s") from exc
        except TransportError as exc:
            self._counts["failures"] += 1
            if pooled is not None and not pooled.alive:
                self._drop(key, pooled, why=str(exc))
            raise

    async def round_trip_s(self, *, host: str, port: int, pin_sha256: str, timeout_s: float) -> float:
        """Seconds from a PING on the peer's pooled connection (opened if there is none) to its
        acknowledgement: the network's round trip, without a handshake or any work of the peer's.

        A kept connection the peer does not acknowledge within `timeout_s` is dropped (a peer restarted
        on the same address ignores the old connection's packets, and a call on it would wait out its
        whole timeout), so the next call reconnects. Raises TransportError: `timeout`, or what opening
        the connection raised."""
        if self._closed:
            raise TransportError("connection_closed", "the QUIC pool is closed")
        self._start_reaper()
        key = (host, port, pin_sha256.lower(), 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        kept = key in self._pooled
        try:
            async with asyncio.timeout_at(deadline):
                pooled = await self._connection(key)
        except TimeoutError as exc:
            raise TransportError("timeout", f"no QUIC handshake with {host}:{port} within {timeout_s} s") from exc
        pooled.last_used = time.monotonic()  # in use: the idle reaper leaves it be
        try:
            return await pooled.connection.protocol.ping_within(max(0.001, deadline - loop.time()))
        except TimeoutError as exc:
            if kept:  # a connection just opened answered its handshake: the handshake took the time
                self._drop(key, pooled, why=f"no acknowledgement of a PING within {timeout_s:g} s")
            raise TransportError("timeout", f"{host}:{port} did not acknowledge a PING within {timeout_s:g} s") from exc
        except ConnectionError as exc:
            self._drop(key, pooled, why="closed during a PING")
            raise TransportError("connection_closed", f"the connection to {host}:{port} closed: {exc}") from exc
        finally:
            pooled.last_used = time.monotonic()

    def lanes_for(self, *, host: str, port: int, pin_sha256: str, nbytes: int) -> list[tuple[int, int]]:
        """The lanes a request of about `nbytes` each way to this peer may be split over now, each with
        its window (bytes, 0 when unknown): [(0, 0)] unless the peer's connection is open and
        core/transport/lanes.py wants more. Missing lanes up to what it wants start opening, for the
        requests after this one."""
        if nbytes < 2 * MIN_LANE_BYTES or self._settings.max_lanes <= 1:  # a decode step's: at once
            return [(0, 0)]
        key = (host, port, pin_sha256.lower(), 0)
        pooled = self._pooled.get(key)
        if pooled is None or not pooled.alive or self._closed:
            return [(0, 0)]
        if pooled.lanes is None:
            pooled.lanes = LanePolicy(self._settings.max_lanes)
        window, rtt_s = self._window(pooled)
        now = time.monotonic()
        wanted = pooled.lanes.wanted(nbytes, window=window, rtt_s=rtt_s, now=now)
        ready = [(0, window or 0)]
        for lane in range(1, wanted):
            other = (*key[:3], lane)
            kept = self._pooled.get(other)
            if kept is not None and kept.alive:
                if kept.proven:
                    ready.append((lane, self._window(kept)[0] or 0))
                continue
            if kept is not None:  # it died (closed by the peer, or by its door's connection limit)
                self._drop(other, kept, why=kept.connection.protocol.terminated or "terminated")
                self._lane_retry_at[other] = now + LANE_RETRY_S
            if other not in self._opening and now >= self._lane_retry_at.get(other, 0.0):
                self._warm(other)
        return ready

    def _window(self, pooled: _Pooled) -> tuple[int | None, float | None]:
        """(the window a request and its answer go out in, bytes; the smoothed RTT) of one connection:
        the smaller of its own congestion window and the one the peer stated on its last large answer
        (a multi-expert answer is several times its request, and comes in the peer's window). None
        where there is none yet."""
        protocol = pooled.connection.protocol
        window, rtt_s = self._settings.lib.path_state(protocol._quic)
        if window is not None and protocol.peer_window is not None:
            window = min(window, protocol.peer_window)
        return window, rtt_s

    def smoothed_rtt_s(self, *, host: str, port: int, pin_sha256: str) -> float | None:
        """The smoothed RTT of this peer's first connection, the path's own round trip (None: no
        connection open, or no sample yet)."""
        pooled = self._pooled.get((host, port, pin_sha256.lower(), 0))
        if pooled is None or not pooled.alive:
            return None
        return self._settings.lib.path_state(pooled.connection.protocol._quic)[1]

    def heard_since(self, *, host: str, port: int, pin_sha256: str, since: float) -> bool:
        """Whether any connection to this peer received a datagram (an answer, an ACK) at or after `since`
        (time.monotonic()): a peer that is slow but alive acknowledges what it is sent, a hung one
        (stopped, crashed, unreachable) is silent."""
        peer = (host, port, pin_sha256.lower())
        return any(key[:3] == peer and pooled.connection.protocol.last_received >= since
                   for key, pooled in list(self._pooled.items()))

    def _warm(self, key: Key) -> None:
        task = asyncio.ensure_future(self._open_lane(key))
        self._warming.add(task)
        task.add_done_callback(lambda done: self._warmed(key, done))

    async def _open_lane(self, key: Key) -> None:
        pooled = await self._connection(key)
        if pooled.proven:
            return
        try:
            await pooled.connection.protocol.ping_within(LANE_PROOF_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            self._drop(key, pooled, why="a new lane did not answer its first PING")
            raise
        pooled.proven = pooled.alive

    def _warmed(self, key: Key, task: asyncio.Task[None]) -> None:
        self._warming.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._lane_retry_at[key] = time.monotonic() + LANE_RETRY_S
            logger.debug("QUIC pool: lane %d to %s:%d did not open: %s", key[3], key[0], key[1], task.exception())

    def _suspect(self, key: Key, pooled: _Pooled, sent_at: float) -> None:
        """A call timed out: is the peer gone (crashed, restarted, unreachable) without a word?"""
        protocol = pooled.connection.protocol
        if protocol.last_received < sent_at and time.monotonic() - sent_at > 2 * protocol.ack_hold_s:
            # Not one datagram (not even an ACK) came back during the whole call, and the call was
            # longer than a peer holds the ACK of a request it is answering (quic_lib.GuardedTransmit).
            self._drop(key, pooled, why="silent through a whole call")
        else:  # something came back, but perhaps only the tail of an earlier exchange: ask
            self._check_soon(key, pooled)

    def _check_soon(self, key: Key, pooled: _Pooled) -> None:
        """PING the peer unless a check is running; no acknowledgement within PING_TIMEOUT_S drops it."""
        if pooled.checking is None or pooled.checking.done():
            pooled.checking = asyncio.ensure_future(
                self._ping_or_drop(key, pooled, after="after a call timed out or was raced out unanswered"))

    async def _ping_or_drop(self, key: Key, pooled: _Pooled, *, after: str) -> None:
        """PING the peer; drop its connection when no acknowledgement comes within PING_TIMEOUT_S."""
        try:
            await pooled.connection.protocol.ping_within(PING_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception:  # no acknowledgement in time, or the connection ended meanwhile
            self._drop(key, pooled, why=f"no acknowledgement of a PING within {PING_TIMEOUT_S:g} s {after}")

    async def _connection(self, key: Key) -> _Pooled:
        pooled = self._pooled.get(key)
        if pooled is not None and pooled.checking is not None and not pooled.checking.done():
            # Calls after a timeout wait for the verdict rather than queue on a dead connection.
            await asyncio.shield(pooled.checking)
            pooled = self._pooled.get(key)
        if pooled is not None:
            if pooled.alive:
                return pooled
            self._drop(key, pooled, why=pooled.connection.protocol.terminated or "terminated")
        opening = self._opening.get(key)
        if opening is None:
            # One handshake per peer, whoever asks first; the others wait for the same one.
            opening = self._opening[key] = asyncio.ensure_future(self._open(key))
            opening.add_done_callback(lambda done: self._opened(key, done))
        # shield: one waiter giving up (cancelled, timed out) must not abort the handshake the
        # other waiters share.
        return await asyncio.shield(opening)

    def _opened(self, key: Key, task: asyncio.Task[_Pooled]) -> None:
        self._opening.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have given up before it failed

    async def _open(self, key: Key) -> _Pooled:
        host, port, pin, _ = key
        self._counts["handshakes"] += 1
        if key in self._ever_opened:
            self._counts["reconnects"] += 1
        connection = await open_connection(host=host, port=port, pin_sha256=pin, settings=self._settings,
                                           timeout_s=self._connect_timeout_s)
        self._ever_opened.add(key)
        if self._closed:
            await connection.close()
            raise TransportError("connection_closed", "the QUIC pool is closed")
        pooled = self._pooled[key] = _Pooled(connection, asyncio.Semaphore(self._max_streams), proven=not key[3])
        return pooled

    def _drop(self, key: Key, pooled: _Pooled, *, why: str) -> None:
        if self._pooled.get(key) is pooled:
            del self._pooled[key]
            logger.info("QUIC pool: dropping the connection to %s:%d (%s)", key[0], key[1], why)
            self._close_soon(pooled.connection)

    def _close_soon(self, connection: OpenConnection) -> None:
        # Closing waits out QUIC's closing period; nobody needs to wait for that but the pool's close.
        task = connection.close_soon()
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())

    async def _reap(self) -> None:
        """Close connections idle for `idle_close_s` (no call in flight, none started since), and PING each
        one it keeps that heard nothing for a third of QUIC's idle timeout. A connection kept longer than
        that timeout would otherwise end by itself, and the next call would pay a new handshake and a new
        connection's congestion window: 3.2-3.5 round trips of the first token after a quiet spell, where a
        kept connection paid at most 1.3 (docs/performance.md, "The first generation after a quiet spell").
        A peer that does not acknowledge the PING is dropped, before a call waits on it."""
        quiet_s = self._settings.idle_timeout_s / 3
        period = max(0.05, min(self._idle_close_s / 2, 30.0, quiet_s / 2))
        while not self._closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            for key, pooled in list(self._pooled.items()):
                if not pooled.alive:
                    self._drop(key, pooled, why=pooled.connection.protocol.terminated or "terminated")
                elif not pooled.busy and now - pooled.last_used >= self._idle_close_s:
                    self._drop(key, pooled, why=f"idle for {self._idle_close_s:g} s")
                elif now - pooled.connection.protocol.last_received >= quiet_s and (
                        pooled.keeping is None or pooled.keeping.done()):
                    self._counts["keepalive_pings"] += 1
                    # pooled.keeping, not .checking: no call waits on a keep-alive's verdict
                    pooled.keeping = asyncio.ensure_future(self._ping_or_drop(key, pooled, after="(keep-alive)"))

    async def close(self) -> None:
        """Close every connection; calls in flight fail with `connection_closed`."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for task in [*self._opening.values(), *self._warming]:
            task.cancel()
        for pooled in self._pooled.values():
            for task in (pooled.checking, pooled.keeping):
                if task is not None:
                    task.cancel()
        for key, pooled in list(self._pooled.items()):
            self._drop(key, pooled, why="pool closed")
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def stats(self) -> dict[str, int]:
        """Counters since the pool was made, and the connections open now (`open_lanes`: those beyond
        each peer's first, once proven)."""
        return {
            "open_connections": sum(1 for pooled in self._pooled.values() if pooled.alive),
            "open_lanes": sum(1 for (*_, lane), p in self._pooled.items() if lane and p.alive and p.proven),
            "in_flight": sum(pooled.connection.protocol.in_flight for pooled in self._pooled.values()),
            **{name: self._counts[name] for name in
               ("handshakes", "reconnects", "calls", "cancelled_streams", "failures", "keepalive_pings")},
        }
