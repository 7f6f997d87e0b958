"""Network impairment in user space: a UDP relay with delay, jitter, loss and reordering.

The kernel on the machines this project runs on has no `netem` qdisc (`tc qdisc add … netem`
answers "Specified qdisc kind is unknown", and there is no module to load), so the e2e test and
the benchmark of the forward under network conditions put this relay in front of each node's
QUIC door instead: the node advertises the relay's address (`TENZRO_PUBLIC_QUIC`) and every peer
reaches it through the relay, both directions impaired. One relay forwards between any number of
clients and one server: each client address gets its own upstream socket, so the server sees
one distinct peer per client, as it would without the relay.

Each datagram gets its own release time from `Impairment.fate` and waits in a heap
(`DelayLine`), so a delayed datagram never holds back the ones behind it in time: a
60 ms one-way delay costs 60 ms of latency, not 60 ms per datagram of throughput.

Semantics, per direction, per datagram (close to netem's):
  * lost with probability `loss`;
  * else, with probability `reorder`, sent at once (it overtakes the datagrams still waiting);
  * else delayed `delay_ms` plus jitter (normal with sigma `jitter_ms`, or uniform within
    ± `jitter_ms`), never less than 0 and — unless `reorder` picked it — never before the
    datagram ahead of it in the same direction: jitter alone does not reorder. (netem's
    jitter does reorder; on a burst of back-to-back datagrams that is hundreds of reorderings
    per window, which real paths do not do and which QUIC's loss detection reads as loss.)

The core (`Impairment`, `DelayLine`) is sans-I/O and seeded; `UdpRelay` is the asyncio
adapter; `RelayThread` runs relays on a loop of its own in a background thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Address = tuple[str, int]


@dataclass(frozen=True)
class Impairment:
    """One direction's conditions; `delay_ms` is one-way (a relay in front of a server adds it twice to an RTT)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    jitter: str = "normal"  # "normal" (sigma = jitter_ms) or "uniform" (within ± jitter_ms)
    loss: float = 0.0  # probability a datagram is dropped
    reorder: float = 0.0  # probability a datagram skips the delay (and so overtakes the queue)

    def __post_init__(self) -> None:
        if self.jitter not in ("normal", "uniform"):
            raise ValueError(f"jitter must be 'normal' or 'uniform', not {self.jitter!r}")
        if not (0.0 <= self.loss <= 1.0 and 0.0 <= self.reorder <= 1.0):
            raise ValueError("loss and reorder are probabilities")
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError("delay and jitter are >= 0")

    def describe(self) -> str:
        if self == Impairment():
            return "none"
        sign = "σ" if self.jitter == "normal" else "±"
        parts = [f"{self.delay_ms:g} ms {sign}{self.jitter_ms:g} ms one-way", f"loss {self.loss:.1%}"]
        if self.reorder:
            parts.append(f"reorder {self.reorder:.1%}")
        return ", ".join(parts)

    def fate(self, rng: random.Random, now: float, last_release: float) -> tuple[float | None, bool]:
        """(release time in seconds, or None when lost; whether it was reordered)."""
        if self.loss and rng.random() < self.loss:
            return None, False
        if self.reorder and rng.random() < self.reorder:
            return now, True
        delay = self.delay_ms
        if self.jitter_ms:
            delay += (rng.gauss(0.0, self.jitter_ms) if self.jitter == "normal"
                      else rng.uniform(-self.jitter_ms, self.jitter_ms))
        return max(now + max(delay, 0.0) / 1e3, last_release), False


@dataclass
class Counters:
    received: int = 0
    sent: int = 0
    lost: int = 0
    reordered: int = 0

    def add(self, other: Counters) -> None:
        for name in ("received", "sent", "lost", "reordered"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class DelayLine:
    """Datagrams of one direction waiting for their release time (a heap; FIFO among equal times)."""

    impairment: Impairment
    rng: random.Random
    counters: Counters = field(default_factory=Counters)
    _heap: list[tuple[float, int, Any]] = field(default_factory=list)
    _seq: int = 0
    _last_release: float = 0.0

    def push(self, now: float, item: Any) -> None:
        self.counters.received += 1
        release, reordered = self.impairment.fate(self.rng, now, self._last_release)
        if release is None:
            self.counters.lost += 1
            return
        if reordered:
            self.counters.reordered += 1
        else:
            self._last_release = release
        self._seq += 1
        heapq.heappush(self._heap, (release, self._seq, item))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[Any]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        self.counters.sent += len(due)
        return due


# -- asyncio adapter ---------------------------------------------------------------------------------

SOCKET_BUFFER = 4 << 20  # bursts of large QUIC datagrams overflow the kernel's ~208 KiB default
MAX_DATAGRAM = 65535
UPSTREAM_IDLE_S = 90.0  # longer than the nodes' QUIC idle timeout (60 s): the connection is gone


def _udp_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


def _drain(sock: socket.socket) -> Iterator[tuple[bytes, Address]]:
    while True:
        try:
            data, addr = sock.recvfrom(MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # e.g. ICMP port unreachable from an earlier send: a datagram lost, as on a wire
            continue
        yield data, addr[:2]


def _send(sock: socket.socket, data: bytes, addr: Address) -> None:
    with contextlib.suppress(OSError):  # a full send buffer or an unreachable port: dropped, as a full queue would
        sock.sendto(data, addr)


class UdpRelay:
    """Relay datagrams between clients of `listen` and the server at `target`, impaired both ways.

    Raw non-blocking sockets watched by the loop's reader callbacks (no protocol objects: an
    upstream socket is made synchronously when a new client's first datagram arrives).
    `impairment` may be replaced while running. Create and use it on one event loop
    (RelayThread does).
    """

    def __init__(self, *, listen: Address, target: Address, impairment: Impairment, seed: int = 0,
                 upstream_host: str | None = None) -> None:
        self.listen, self.target = listen, target
        self.upstream_host = upstream_host or listen[0]
        seeds = random.Random(seed)
        self.down = DelayLine(impairment, random.Random(seeds.random()))  # server -> clients
        self.up = DelayLine(impairment, random.Random(seeds.random()))  # clients -> server
        self._front: socket.socket | None = None
        self._upstreams: dict[Address, socket.socket] = {}
        self._last_heard: dict[Address, float] = {}  # per client: when it last sent
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def impairment(self) -> Impairment:
        return self.up.impairment

    @impairment.setter
    def impairment(self, value: Impairment) -> None:
        self.up.impairment = self.down.impairment = value

    def counters(self) -> Counters:
        total = Counters()
        total.add(self.up.counters)
        total.add(self.down.counters)
        return total

    def start(self) -> UdpRelay:
        """Bind and start relaying; call on the loop's thread."""
        self._loop = asyncio.get_running_loop()
        self._front = _udp_socket(*self.listen)
        self.listen = self._front.getsockname()[:2]
        self._loop.add_reader(self._front, self._from_clients)
        return self

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for sock in (self._front, *self._upstreams.values()):
            if sock is not None:
                self._loop.remove_reader(sock)
                sock.close()
        self._upstreams.clear()
        self._front = None

    def _from_clients(self) -> None:
        now = time.monotonic()
        for data, client in _drain(self._front):
            if client not in self._upstreams:
                # A socket of its own per client: the server tells clients apart by source address.
                upstream = _udp_socket(self.upstream_host, 0)
                self._upstreams[client] = upstream
                self._loop.add_reader(upstream, self._from_server, client, upstream)
                if len(self._upstreams) % 64 == 0:
                    self._forget_idle(now)
            self._last_heard[client] = now
            self.up.push(now, (self._upstreams[client], data, self.target))
        self._reschedule()

    def _forget_idle(self, now: float) -> None:
        """Close the sockets of clients silent for UPSTREAM_IDLE_S: every QUIC connection a node opens
        comes from a port of its own, and a long run would otherwise pass the process's fd limit."""
        for client, heard in list(self._last_heard.items()):
            if now - heard > UPSTREAM_IDLE_S:
                upstream = self._upstreams.pop(client)
                self._loop.remove_reader(upstream)
                upstream.close()
                del self._last_heard[client]

    def _from_server(self, client: Address, upstream: socket.socket) -> None:
        now = time.monotonic()
        for data, _ in _drain(upstream):
            self.down.push(now, (self._front, data, client))
        self._reschedule()

    def _reschedule(self) -> None:
        due = [t for t in (self.up.next_due(), self.down.next_due()) if t is not None]
        if not due or min(due) >= self._timer_at:
            return  # nothing waits, or the timer already set fires first
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = min(due)
        # loop.time() and time.monotonic() are the same clock in CPython's loops; convert anyway.
        self._timer = self._loop.call_at(self._loop.time() + (self._timer_at - time.monotonic()), self._release)

    def _release(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        now = time.monotonic()
        for line in (self.up, self.down):
            for sock, data, addr in line.pop_due(now):
                if sock is not None and sock.fileno() >= 0:
                    _send(sock, data, addr)
        self._reschedule()


class RelayThread:
    """An event loop in a daemon thread hosting relays; `add()` and `close()` from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="netem-relays", daemon=True)
        self._thread.start()
        self.relays: list[UdpRelay] = []

    def add(self, *, listen: Address, target: Address, impairment: Impairment = Impairment(), seed: int = 0,
            upstream_host: str | None = None) -> UdpRelay:
        relay = UdpRelay(listen=listen, target=target, impairment=impairment, seed=seed, upstream_host=upstream_host)
        self.call(relay.start)
        self.relays.append(relay)
        return relay

    def call(self, fn: Any, *args: Any) -> Any:
        """Run fn(*args) on the relays' loop and return its result (relays are not thread-safe)."""
        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def set_impairment(self, impairment: Impairment, *, relay: int | None = None) -> None:
        """Every relay's impairment, or relay `relay`'s (by the order they were added)."""
        def apply() -> None:
            for relay_ in self.relays if relay is None else [self.relays[relay]]:
                relay_.impairment = impairment

        self.call(apply)

    def counters(self) -> Counters:
        def read() -> Counters:
            total = Counters()
            for relay in self.relays:
                total.add(relay.counters())
            return total

        return self.call(read)

    def close(self) -> None:
        self.call(lambda: [relay.close() for relay in self.relays])
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    def __enter__(self) -> RelayThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the reference: a plain UDP ping through a relay -------------------------------------------------


class UdpEcho:
    """A UDP echo server on a thread of its own (the far end of `udp_ping`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.sock.settimeout(0.2)
        self.address: Address = self.sock.getsockname()[:2]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="udp-echo", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                return
            self.sock.sendto(data, addr)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@dataclass(frozen=True)
class PingResult:
    sent: int
    rtts_ms: list[float]

    @property
    def lost(self) -> int:
        return self.sent - len(self.rtts_ms)

    def percentile(self, q: float) -> float | None:
        if not self.rtts_ms:
            return None
        ordered = sorted(self.rtts_ms)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]

    def summary(self) -> dict[str, Any]:
        return {"sent": self.sent, "lost": self.lost, "p50_ms": self.percentile(50), "p99_ms": self.percentile(99),
                "mean_ms": statistics.fmean(self.rtts_ms) if self.rtts_ms else None,
                "stdev_ms": statistics.pstdev(self.rtts_ms) if len(self.rtts_ms) > 1 else None}


def udp_ping(target: Address, *, count: int = 200, interval_s: float = 0.005, timeout_s: float = 1.0,
             source_host: str = "0.0.0.0", size: int = 64) -> PingResult:
    """Round trips of `count` numbered datagrams to an echo at `target` (through a relay: the relay's RTT).

    Sent every `interval_s` without waiting for the answers (as ping -i does), so a slow answer
    does not delay the next probe; answers later than `timeout_s` after the last probe count as lost.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((source_host, 0))
    sock.setblocking(False)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    sent_at: dict[int, float] = {}
    rtts: list[float] = []
    padding = b"\0" * max(0, size - 8)

    def collect_until(deadline: float) -> None:
        # poll, not sleep-and-poll: an answer is timed when it arrives, not at the next poll
        while (remaining := deadline - time.monotonic()) > 0 and (sent_at or seq_next < count):
            if not poller.poll(remaining * 1e3):  # poll, not select: a busy process's fds pass 1024
                return
            now = time.monotonic()
            for data, _ in _drain(sock):
                seq = int.from_bytes(data[:8], "big")
                if seq in sent_at:
                    rtts.append((now - sent_at.pop(seq)) * 1e3)

    seq_next = 0
    try:
        for seq_next in range(1, count + 1):
            sent_at[seq_next - 1] = time.monotonic()
            _send(sock, (seq_next - 1).to_bytes(8, "big") + padding, target)
            collect_until(time.monotonic() + interval_s)
        collect_until(time.monotonic() + timeout_s)
    finally:
        sock.close()
    return PingResult(count, rtts)
