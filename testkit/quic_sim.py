"""Two aioquic connections over a simulated path in virtual time: loss recovery and congestion control, exactly.

A real relay on this 2-core machine is itself a bottleneck (its queue shows in every RTT) and
its timing varies run to run; a congestion controller is judged better on a path whose every
property is known. This drives aioquic's sans-I/O `QuicConnection` pair (the library the node
uses, with the controllers core/transport/quic_lib.py installs) over a `Path`: per direction a
propagation delay, random loss, reordering (a datagram that skips the delay, as the netem relay
does), and optionally a bottleneck link of a given rate with a drop-tail queue of a given size.
Time is a number advanced by the simulation, so a transfer's "duration" is exact and
repeatable for a seed, and costs only the CPU of the two connections.

`transfer(...)` sends `size` bytes on one stream from client to server and answers what
happened: when the last byte arrived, what the path dropped at its queue and at random, and the
sender's recovery state (its `reordering` thresholds, the controller's counters).
"""

from __future__ import annotations

import heapq
import importlib
import random
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

from apps.node.identity import load_or_create_identity
from core.transport import quic_lib
from core.transport.quic import QuicSettings

START = 1_000.0  # virtual seconds; any origin works, aioquic only compares times
DATAGRAM = 1_350


@dataclass(frozen=True)
class Path:
    """One direction of the simulated path."""

    delay_s: float = 0.015
    loss: float = 0.0
    reorder: float = 0.0  # probability a datagram skips the delay (and so overtakes the queue)
    rate_bytes_per_s: float = 0.0  # bottleneck rate; 0 = none
    queue_bytes: int = 0  # the bottleneck's drop-tail queue


@dataclass
class Link:
    path: Path
    rng: random.Random
    busy_until: float = 0.0  # when the bottleneck finishes what it holds
    random_drops: int = 0
    queue_drops: int = 0
    carried: int = 0

    def fate(self, now: float, size: int) -> float | None:
        """When a datagram of `size` bytes sent at `now` arrives; None when dropped."""
        if self.path.loss and self.rng.random() < self.path.loss:
            self.random_drops += 1
            return None
        departure = now
        if self.path.rate_bytes_per_s:
            queued = max(0.0, self.busy_until - now) * self.path.rate_bytes_per_s
            if queued + size > self.path.queue_bytes:
                self.queue_drops += 1
                return None
            self.busy_until = max(now, self.busy_until) + size / self.path.rate_bytes_per_s
            departure = self.busy_until
        self.carried += 1
        if self.path.reorder and self.rng.random() < self.path.reorder:
            return departure
        return departure + self.path.delay_s


@dataclass
class Transfer:
    seconds: float  # from the first byte sent to the last received, virtual
    delivered: int
    links: dict[str, Link]
    sender: Any  # the client's QuicPacketRecovery

    @property
    def controller(self) -> Any:
        return self.sender._cc


@dataclass
class _Endpoint:
    name: str
    connection: Any
    address: tuple[str, int]
    timer_at: float | None = None


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    kind: str = field(compare=False)  # "datagram" or "timer"
    target: str = field(compare=False)
    data: bytes = field(default=b"", compare=False)


def _configurations(work: FilePath, congestion: str) -> tuple[Any, Any]:
    settings = QuicSettings(max_body=1 << 30, library="aioquic", congestion_control=congestion)
    identity = load_or_create_identity(work)
    server = settings.configuration(is_client=False, datagram_size=DATAGRAM)
    server.load_cert_chain(str(identity.cert_path), str(identity.cert_key_path))
    client = settings.configuration(is_client=True, datagram_size=DATAGRAM)
    client.verify_mode = 0  # ssl.CERT_NONE: the simulation pins nothing
    return client, server


def transfer(work: FilePath, *, size: int, up: Path, down: Path | None = None, congestion: str = "tolerant",
             seed: int = 0, limit_s: float = 600.0) -> Transfer:
    """Send `size` bytes client -> server over `up` (ACKs return over `down`, default: `up` without
    its bottleneck); answer when the server has them all, or raise after `limit_s` virtual seconds."""
    quic_lib.load("aioquic")  # installs our controllers into aioquic
    connection_module = importlib.import_module("aioquic.quic.connection")
    packet_module = importlib.import_module("aioquic.quic.packet")
    buffer_module = importlib.import_module("aioquic.buffer")
    client_config, server_config = _configurations(work, congestion)
    rng = random.Random(seed)
    down = down or Path(delay_s=up.delay_s, loss=up.loss, reorder=up.reorder)
    links = {"server": Link(up, random.Random(rng.random())), "client": Link(down, random.Random(rng.random()))}
    client = _Endpoint("client", connection_module.QuicConnection(configuration=client_config), ("10.0.0.1", 1))
    server = _Endpoint("server", None, ("10.0.0.2", 2))
    endpoints = {"client": client, "server": server}
    events: list[_Event] = []
    seq = 0

    def schedule(at: float, kind: str, target: str, data: bytes = b"") -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, _Event(at, seq, kind, target, data))

    def flush(endpoint: _Endpoint, now: float) -> None:
        peer = "server" if endpoint.name == "client" else "client"
        for data, _ in endpoint.connection.datagrams_to_send(now):
            arrival = links[peer].fate(now, len(data))
            if arrival is not None:
                schedule(arrival, "datagram", peer, data)
        timer = endpoint.connection.get_timer()
        if timer is not None and timer != endpoint.timer_at:
            endpoint.timer_at = timer
            schedule(timer, "timer", endpoint.name)

    now = START
    client.connection.connect(server.address, now)
    flush(client, now)
    stream_id, started, received = None, None, 0
    payload = bytes(size)
    while events:
        event = heapq.heappop(events)
        now = event.at
        if now - START > limit_s:
            raise TimeoutError(f"{received} of {size} bytes after {limit_s} virtual seconds")
        endpoint = endpoints[event.target]
        if event.kind == "timer":
            if endpoint.timer_at != event.at:
                continue  # superseded
            endpoint.timer_at = None
            endpoint.connection.handle_timer(now)
        else:
            if endpoint.connection is None:  # the server's connection starts at the client's first datagram
                header = packet_module.pull_quic_header(buffer_module.Buffer(data=event.data), host_cid_length=8)
                endpoint.connection = connection_module.QuicConnection(
                    configuration=server_config, original_destination_connection_id=header.destination_cid)
            endpoint.connection.receive_datagram(event.data, endpoints["client" if event.target == "server"
                                                                       else "server"].address, now)
        while (quic_event := endpoint.connection.next_event()) is not None:
            kind = type(quic_event).__name__
            if kind == "HandshakeCompleted" and endpoint is client:
                stream_id = client.connection.get_next_available_stream_id()
                started = now
                client.connection.send_stream_data(stream_id, payload, end_stream=True)
            elif kind == "StreamDataReceived" and endpoint is server:
                received += len(quic_event.data)
                if quic_event.end_stream and received == size:
                    return Transfer(now - started, received, links, client.connection._loss)
        for side in (client, server):
            if side.connection is not None:
                flush(side, now)
    raise RuntimeError(f"the simulation ran out of events with {received} of {size} bytes delivered")

