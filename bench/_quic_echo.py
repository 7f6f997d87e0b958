"""Echo servers and timers for bench/transport_quic.py (a helper: `make bench` skips _-modules).

A QUIC echo server is the node's own peer-door server (core/transport/quic_server.py) with a
handler that answers the request body; the TCP echo is a plain asyncio stream server with an
8-byte length prefix, the floor any transport pays to move the same bytes on loopback. Either
runs in the benchmark's event loop ("in-process": client and server share one thread) or in
a child process (`python -m bench._quic_echo SPEC`: each side gets its own core, as two nodes
would).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from core.transport.framing import Reply
from core.transport.pool import QuicPool
from core.transport.quic import PeerRequest, QuicSettings, quic_connection, start_server

LENGTH = struct.Struct(">Q")
# The body sizes every table reports: a few rows, a decode batch, a prefill batch of f32 rows.
SIZES = {"64 KB": 64 * 1024, "1 MB": 1 << 20, "4 MB": 4 << 20}
ROOT = Path(__file__).resolve().parent.parent


def settings_from(spec: dict[str, Any]) -> QuicSettings:
    """QuicSettings from a variant's spec (knobs it does not name keep their defaults)."""
    knobs = {k: v for k, v in spec.items() if k in QuicSettings.__dataclass_fields__}
    return QuicSettings(max_body=64 << 20, **knobs)


def run_loop(main: Coroutine[Any, Any, Any], *, uvloop: bool) -> Any:
    if uvloop:
        import uvloop as uv

        return uv.run(main)
    return asyncio.run(main)


async def _echo(request: PeerRequest) -> Reply:
    """The request's body back, or `answer_bytes` zero bytes when the request names that many (bench/netem.py's
    exchanges of a forward's sizes: a holder's answer is not the size of its request)."""
    size = request.params.get("answer_bytes")
    return Reply.ok({}, request.body if size is None else bytes(int(size)))


async def start_quic_echo(spec: dict[str, Any], cert: str, key: str, port: int) -> Any:
    return await start_server(host="127.0.0.1", port=port, cert_path=cert, key_path=key, handler=_echo,
                              settings=settings_from(spec))


async def start_tcp_echo() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
                data = await reader.readexactly(size)
                writer.write(LENGTH.pack(size))
                writer.write(data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):  # the client hung up: done
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


@dataclass
class Timing:
    """Wall-clock seconds per round trip, and CPU seconds all of them took on both ends."""

    samples: list[float]
    cpu_s: float

    @property
    def cpu_ms_per_call(self) -> float:
        return self.cpu_s / len(self.samples) * 1000


def cpu_seconds(pid: int | None) -> float:
    """CPU time of this process, plus the echo child's when there is one (user + system)."""
    total = time.process_time()
    if pid is not None:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


async def _timed(one_trip: Callable[[], Awaitable[None]], repeats: int, child: int | None, gap_s: float = 0.0
                 ) -> Timing:
    """`repeats` trips, `gap_s` apart (the CPU of the gaps counted: what a trip leaves to send goes then)."""
    await one_trip()  # warm: socket buffers, the pool's handshake, first allocations
    samples = []
    cpu = cpu_seconds(child)
    for _ in range(repeats):
        start = time.perf_counter()
        await one_trip()
        samples.append(time.perf_counter() - start)
        if gap_s:
            await asyncio.sleep(gap_s)
    return Timing(samples, cpu_seconds(child) - cpu)


async def time_tcp(port: int, body: bytes, repeats: int, child: int | None, gap_s: float = 0.0) -> Timing:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def one_trip() -> None:
        writer.write(LENGTH.pack(len(body)))
        writer.write(body)
        await writer.drain()
        (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
        await reader.readexactly(size)

    try:
        return await _timed(one_trip, repeats, child, gap_s)
    finally:
        writer.close()
        await writer.wait_closed()


async def time_quic(pool: QuicPool, port: int, pin: str, body: bytes, repeats: int, child: int | None,
                    gap_s: float = 0.0) -> Timing:
    async def one_trip() -> None:
        _, out = await pool.call(host="127.0.0.1", port=port, pin_sha256=pin, method="echo", params={}, body=body,
                                 timeout_s=120)
        assert len(out) == len(body), (len(out), len(body))

    return await _timed(one_trip, repeats, child, gap_s)


async def time_quic_concurrent(pool: QuicPool, port: int, pin: str, body: bytes, streams: int, repeats: int,
                               child: int | None) -> Timing:
    """`streams` echoes of `body` in flight at once on the pooled connection, per round trip of all."""
    async def one_trip() -> None:
        await asyncio.gather(*(pool.call(host="127.0.0.1", port=port, pin_sha256=pin, method="echo", params={},
                                         body=body, timeout_s=120) for _ in range(streams)))

    return await _timed(one_trip, repeats, child)


async def time_occasional(how: str, *, settings: QuicSettings, pool: QuicPool, port: int, tcp_port: int, pin: str,
                          body: bytes, repeats: int, child: int | None, gap_s: float) -> Timing:
    """A gossip call's pattern, `gap_s` apart: "kept" = a PING on the pooled connection, then the call
    (apps/providers/rounds.py); "per call" = open a connection, call, PING, close (as gossip did);
    "tcp" = connect, echo, close: the reference."""
    async def kept() -> None:
        await pool.round_trip_s(host="127.0.0.1", port=port, pin_sha256=pin, timeout_s=5)
        await pool.call(host="127.0.0.1", port=port, pin_sha256=pin, method="echo", params={}, body=body,
                        timeout_s=5)

    async def per_call() -> None:
        async with quic_connection(host="127.0.0.1", port=port, pin_sha256=pin, settings=settings,
                                   timeout_s=5) as connection:
            await connection.call("echo", {}, body, timeout_s=5)
            await connection.round_trip_s(timeout_s=5)

    async def tcp() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", tcp_port)
        writer.write(LENGTH.pack(len(body)) + body)
        await writer.drain()
        (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
        await reader.readexactly(size)
        writer.close()
        await writer.wait_closed()

    return await _timed({"kept": kept, "per call": per_call, "tcp": tcp}[how], repeats, child, gap_s)


@contextlib.asynccontextmanager
async def echo_child(spec: dict[str, Any], cert: str, key: str, port: int) -> AsyncIterator[tuple[int, int]]:
    """A child process serving QUIC echo on `port` and TCP echo; yields (TCP port, its pid)."""
    argv = [sys.executable, "-m", "bench._quic_echo", json.dumps({**spec, "cert": cert, "key": key, "port": port})]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env=os.environ.copy())
    try:
        assert child.stdout is not None
        line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
        if not line.startswith(b"READY "):
            raise RuntimeError(f"echo child did not start: {line!r}")
        yield int(line.split()[1]), child.pid
    finally:
        if child.stdin is not None:
            child.stdin.close()  # the child exits when its stdin closes
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _serve_forever(spec: dict[str, Any]) -> None:
    async def main() -> None:
        quic = await start_quic_echo(spec, spec["cert"], spec["key"], spec["port"])
        tcp, tcp_port = await start_tcp_echo()
        print(f"READY {tcp_port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
        quic.close()
        tcp.close()

    run_loop(main(), uvloop=bool(spec.get("uvloop")))



if __name__ == "__main__":
    _serve_forever(json.loads(sys.argv[1]))
