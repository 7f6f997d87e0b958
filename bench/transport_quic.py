"""QUIC transport benchmark: every knob, both libraries, against TCP and the node's HTTP door.

Run: .venv/bin/python -m bench.transport_quic [--quick] [--no-node]

1. Echo of 64 KB, 1 MB and 4 MB bodies through the peer-door server and the client pool
   (core/transport), per variant: the tuned default of each library (qh3, aioquic), the
   settings before tuning (1,350-byte datagrams, the kernel's socket buffers, the server on
   asyncio's UDP endpoint), and one knob changed at a time — datagram size, flow-control windows,
   socket buffers, congestion control (aioquic), event loop (uvloop), and for qh3 at an Ethernet
   path's 1,452-byte datagrams the server's sends batched (GSO, the default) or one per call.
   Each runs in-process (server and client on one event loop) and across processes (the server
   in a child), beside a plain asyncio TCP echo of the same bytes in the same mode: the
   reference every ratio is to. Variants are measured
   in interleaved rounds so drift (other work on the machine) hits them alike; the median of
   all rounds' samples is reported. ms = median round trip; MB/s = body bytes / round trip.
2. Through a real node (testkit.nodes.NodeProcess) holding one f32 expert (d_model 2048):
   moe/execute of the same 64 KB / 1 MB / 4 MB of rows over the QUIC peer door (each library
   on the node and the client) and over HTTP (`POST /peer/moe/execute`, the same TZ frames,
   when the node has that route; else JSON-RPC `tenzro_moeExecute` with base64 rows, as
   bench/transport.py); each door's cost is the round trip less the holder's own compute_ms.
3. Paced small calls, across processes: an 8 KB echo every 8 ms (a router calling one holder
   layer after layer), each library with its ACKs held (the default, docs/protocol.md "QUIC
   transport parameters") and sent at once (TENZRO_QUIC_ACK_HOLD_MS=0), beside a TCP echo at
   the same pace: median round trip and CPU of both ends per call, gaps included.
4. Occasional calls, across processes: a 1 KB echo every 100 ms (gossip calling a peer), on a kept
   connection with a PING first (apps/providers/rounds.py) and on a new connection per call (open,
   call, PING, close; the closing period runs on after the call returns), beside a TCP connection
   per call.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import socket
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.node.identity import load_or_create_identity
from core.transport import quic_lib
from core.transport.pool import QuicPool
from core.transport.udp import tune_socket

from ._quic_echo import (
    SIZES,
    Timing,
    echo_child,
    median_ms,
    run_loop,
    settings_from,
    start_quic_echo,
    start_tcp_echo,
    time_occasional,
    time_quic,
    time_quic_concurrent,
    time_tcp,
)
from .report import headline, print_table, write_results

MIB = 1 << 20
LIBRARIES = ("qh3", "aioquic")
CONCURRENT_STREAMS = 8


@dataclass(frozen=True)
class Variant:
    label: str
    knob: str
    spec: dict[str, Any] = field(hash=False)

    @property
    def uvloop(self) -> bool:
        return bool(self.spec.get("uvloop"))


def variants(libraries: tuple[str, ...]) -> list[Variant]:
    """Each library's default, the pre-tuning settings, and one knob changed at a time."""
    out: list[Variant] = []
    for lib in libraries:
        ceiling = quic_lib.load(lib).max_datagram_size
        default = {"library": lib, "max_datagram_size": 0, "connection_window": 64 * MIB, "stream_window": 64 * MIB,
                   "socket_buffer_bytes": 4 * MIB, "congestion_control": ""}

        def knob(label: str, name: str, default: dict[str, Any] = default, lib: str = lib, **change: Any) -> Variant:
            return Variant(f"{lib}: {label}", name, {**default, **change})

        out.append(knob("default (path MTU, 64 MiB windows, 4 MiB buffers)", "default"))
        out.append(knob("before tuning (1,350 B, kernel buffers)", "before", max_datagram_size=1350,
                        socket_buffer_bytes=0, batched_server=False))
        if quic_lib.load(lib).serve_batched is not None:  # Ethernet-sized datagrams: the server's sends batched or not
            out.append(knob("datagram 1,452 B (Ethernet)", "datagram", max_datagram_size=1452))
            out.append(knob("datagram 1,452 B, server on asyncio's endpoint (a system call a datagram)", "server send",
                            max_datagram_size=1452, batched_server=False))
        for size in (1200, 8192, 16384, 32768):
            if size < ceiling:
                out.append(knob(f"datagram {size:,} B", "datagram", max_datagram_size=size))
        out.append(knob("windows 1 MiB stream / 16 MiB connection", "windows", stream_window=MIB,
                        connection_window=16 * MIB))
        out.append(knob("windows 8 MiB", "windows", stream_window=8 * MIB, connection_window=8 * MIB))
        out.append(knob("socket buffers: kernel default", "socket buffers", socket_buffer_bytes=0))
        out.append(knob("socket buffers 1 MiB", "socket buffers", socket_buffer_bytes=MIB))
        for algorithm in quic_lib.load(lib).congestion_controls[1:]:  # the first is the library's default
            out.append(knob(f"congestion {algorithm}", "congestion", congestion_control=algorithm))
        out.append(knob("uvloop", "event loop", uvloop=True))
    return out


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _measure_variant(variant: Variant | None, identity: Any, repeats: dict[str, int], *,
                           cross_process: bool) -> dict[str, Timing]:
    """Timings per size for one variant (None: the TCP reference), one round."""
    timings: dict[str, Timing] = {}
    spec = variant.spec if variant else {}
    port = _free_udp_port()
    cert, key = str(identity.cert_path), str(identity.cert_key_path)
    async with _servers(spec, cert, key, port, cross_process=cross_process) as (tcp_port, child):
        if variant is None:
            for name, size in SIZES.items():
                timings[name] = await time_tcp(tcp_port, b"\x5a" * size, repeats[name], child)
            return timings
        pool = QuicPool(settings_from(spec))
        try:
            for name, size in SIZES.items():
                timings[name] = await time_quic(pool, port, identity.cert_sha256, b"\x5a" * size, repeats[name], child)
            if variant.knob == "default":
                timings["concurrent"] = await time_quic_concurrent(pool, port, identity.cert_sha256, b"\x5a" * MIB,
                                                                   CONCURRENT_STREAMS, repeats["4 MB"], child)
        finally:
            await pool.close()
    return timings


class _servers:
    """QUIC + TCP echo, in this loop or in a child process; enters as (TCP port, child pid or None)."""

    def __init__(self, spec: dict[str, Any], cert: str, key: str, port: int, *, cross_process: bool) -> None:
        self._args = (spec, cert, key, port)
        self._cross = cross_process
        self._child: Any = None
        self._local: list[Any] = []

    async def __aenter__(self) -> tuple[int, int | None]:
        spec, cert, key, port = self._args
        if self._cross:
            self._child = echo_child(spec, cert, key, port)
            return await self._child.__aenter__()
        tcp, tcp_port = await start_tcp_echo()
        self._local = [tcp, await start_quic_echo(spec, cert, key, port)] if spec else [tcp]
        return tcp_port, None

    async def __aexit__(self, *exc: Any) -> None:
        if self._child is not None:
            await self._child.__aexit__(*exc)
        for server in self._local:
            server.close()


def run_echo(libraries: tuple[str, ...], rounds: int, repeats: dict[str, int], work: Path) -> list[dict[str, Any]]:
    identity = load_or_create_identity(work / "echo-identity")
    rows: list[dict[str, Any]] = []
    for cross in (False, True):
        mode = "cross-process" if cross else "in-process"
        every: list[Variant | None] = [None, *variants(libraries)]
        samples: dict[int, dict[str, list[float]]] = {i: {} for i in range(len(every))}
        cpu: dict[int, dict[str, list[float]]] = {i: {} for i in range(len(every))}
        for round_ in range(rounds):
            print(f"  {mode}: round {round_ + 1} of {rounds}", flush=True)
            for i, variant in enumerate(every):
                got = run_loop(_measure_variant(variant, identity, repeats, cross_process=cross),
                               uvloop=bool(variant and variant.uvloop))
                for name, timing in got.items():
                    samples[i].setdefault(name, []).extend(timing.samples)
                    cpu[i].setdefault(name, []).append(timing.cpu_ms_per_call)
        tcp = {name: median_ms(values) for name, values in samples[0].items()}
        for i, variant in enumerate(every):
            medians = {name: median_ms(values) for name, values in samples[i].items()}
            row: dict[str, Any] = {
                "mode": mode, "variant": variant.label if variant else "tcp reference (asyncio, loopback)",
                "knob": variant.knob if variant else "reference", "spec": variant.spec if variant else {},
                "library": f"{variant.spec['library']} {quic_lib.load(variant.spec['library']).version}"
                if variant else "-",
                "ms": {name: medians[name] for name in SIZES},
                "mb_per_s": {name: SIZES[name] / medians[name] / 1e3 for name in SIZES},
                "vs_tcp": {name: medians[name] / tcp[name] for name in SIZES},
                # CPU of both ends per round trip: what the knob costs, little moved by other load.
                "cpu_ms": {name: statistics.median(cpu[i][name]) for name in SIZES},
            }
            if "concurrent" in medians:
                row["concurrent_8x1MB_mb_per_s"] = CONCURRENT_STREAMS * MIB / medians["concurrent"] / 1e3
            rows.append(row)
    return rows


def echo_table(rows: list[dict[str, Any]], mode: str) -> list[list[Any]]:
    table = []
    for row in rows:
        if row["mode"] != mode:
            continue
        cells: list[Any] = [row["variant"]]
        for name in SIZES:
            cells += [row["ms"][name], f"{row['mb_per_s'][name]:.0f}", f"{row['vs_tcp'][name]:.1f}x",
                      row["cpu_ms"][name]]
        cells.append(f"{row['concurrent_8x1MB_mb_per_s']:.0f}" if "concurrent_8x1MB_mb_per_s" in row else "")
        table.append(cells)
    return table


PACED_BODY, PACED_GAP_S = 8 * 1024, 0.008


async def _paced(spec: dict[str, Any] | None, identity: Any, calls: int) -> Timing:
    port = _free_udp_port()
    body = b"\x5a" * PACED_BODY
    async with _servers(spec or {}, str(identity.cert_path), str(identity.cert_key_path), port,
                        cross_process=True) as (tcp_port, child):
        if spec is None:
            return await time_tcp(tcp_port, body, calls, child, PACED_GAP_S)
        pool = QuicPool(settings_from(spec))
        try:
            return await time_quic(pool, port, identity.cert_sha256, body, calls, child, PACED_GAP_S)
        finally:
            await pool.close()


def _interleaved(what: str, every: list[tuple[str, Callable[[], Timing]]], rounds: int) -> list[dict[str, Any]]:
    """Each variant measured once a round, rounds interleaved; the first is the reference of the ratios."""
    samples: dict[str, list[float]] = {label: [] for label, _ in every}
    cpu: dict[str, list[float]] = {label: [] for label, _ in every}
    for round_ in range(rounds):
        print(f"  {what}: round {round_ + 1} of {rounds}", flush=True)
        for label, measure in every:
            timing = measure()
            samples[label] += timing.samples
            cpu[label].append(timing.cpu_ms_per_call)
    ref_ms, ref_cpu = median_ms(samples[every[0][0]]), statistics.median(cpu[every[0][0]])
    return [{"variant": label, "ms": median_ms(samples[label]), "vs_tcp": median_ms(samples[label]) / ref_ms,
             "cpu_ms": statistics.median(cpu[label]), "cpu_vs_tcp": statistics.median(cpu[label]) / ref_cpu}
            for label, _ in every]


def run_paced(libraries: tuple[str, ...], rounds: int, calls: int, work: Path) -> list[dict[str, Any]]:
    identity = load_or_create_identity(work / "paced-identity")
    specs: list[tuple[str, dict[str, Any] | None]] = [("tcp reference (asyncio, loopback)", None)]
    for lib in libraries:
        specs += [(f"{lib}: ACKs held (default)", {"library": lib}),
                  (f"{lib}: ACKs at once (hold 0)", {"library": lib, "ack_hold_s": 0.0})]
    return _interleaved("paced", [(label, functools.partial(lambda spec: run_loop(
        _paced(spec, identity, calls), uvloop=False), spec)) for label, spec in specs], rounds)


OCCASIONAL_BODY, OCCASIONAL_GAP_S = 1024, 0.1


async def _occasional(spec: dict[str, Any], how: str, identity: Any, calls: int) -> Timing:
    port = _free_udp_port()
    async with _servers(spec, str(identity.cert_path), str(identity.cert_key_path), port,
                        cross_process=True) as (tcp_port, child):
        pool = QuicPool(settings_from(spec))
        try:
            return await time_occasional(how, settings=settings_from(spec), pool=pool, port=port, tcp_port=tcp_port,
                                         pin=identity.cert_sha256, body=b"\x5a" * OCCASIONAL_BODY, repeats=calls,
                                         child=child, gap_s=OCCASIONAL_GAP_S)
        finally:
            await pool.close()


def run_occasional(libraries: tuple[str, ...], rounds: int, calls: int, work: Path) -> list[dict[str, Any]]:
    """Gossip's pattern: a small call now and then to a peer, on a kept connection or a new one each time."""
    identity = load_or_create_identity(work / "occasional-identity")
    specs: list[tuple[str, str, dict[str, Any]]] = [("tcp reference: connect, echo, close", "tcp", {})]
    for lib in libraries:
        specs += [(f"{lib}: kept connection, PING + call", "kept", {"library": lib}),
                  (f"{lib}: connection per call (open, call, PING, close)", "per call", {"library": lib})]
    return _interleaved("occasional", [(label, functools.partial(lambda spec, how: run_loop(
        _occasional(spec, how, identity, calls), uvloop=False), spec, how)) for label, how, spec in specs], rounds)


def _print_against_tcp(rows: list[dict[str, Any]], title: str) -> None:
    if rows:
        print_table(title, ["variant", "ms", "/tcp", "cpu ms", "cpu /tcp"],
                    [[r["variant"], r["ms"], f"{r['vs_tcp']:.2f}x", r["cpu_ms"], f"{r['cpu_vs_tcp']:.2f}x"]
                     for r in rows])


def granted_buffers() -> dict[str, Any]:
    """What the kernel grants a UDP socket for each buffer size the variants ask for."""
    out = {}
    for asked in (0, MIB, 4 * MIB):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            got = tune_socket(sock, asked)
        assert got is not None
        out[str(asked)] = {"receive": got.receive, "send": got.send}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, fewer repeats")
    parser.add_argument("--no-node", action="store_true", help="skip the rows through a real node")
    parser.add_argument("--no-echo", action="store_true", help="skip the echo tables")
    parser.add_argument("--no-paced", action="store_true", help="skip the paced small calls")
    parser.add_argument("--no-occasional", action="store_true", help="skip the occasional calls (gossip's pattern)")
    parser.add_argument("--libraries", default=",".join(LIBRARIES), help="comma-separated: qh3,aioquic")
    args = parser.parse_args()
    libraries = tuple(name for name in args.libraries.split(",") if name)
    rounds = 1 if args.quick else 3
    repeats = {"64 KB": 8, "1 MB": 4, "4 MB": 2} if args.quick else {"64 KB": 12, "1 MB": 5, "4 MB": 3}
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-quic-"))
    try:
        buffers = granted_buffers()
        print(f"UDP socket buffers granted (asked -> SO_RCVBUF/SO_SNDBUF as reported, Linux doubles): {buffers}")
        rows = [] if args.no_echo else run_echo(libraries, rounds, repeats, work)
        columns = ["variant"]
        for name in SIZES:
            columns += [f"{name} ms", "MB/s", "/tcp", "cpu ms"]
        columns.append(f"{CONCURRENT_STREAMS}x1MB MB/s")
        for mode in () if args.no_echo else ("in-process", "cross-process"):
            print_table(f"QUIC echo, {mode}: median round trip, body MB/s, ratio to the TCP echo, CPU ms of both "
                        f"ends per round trip ({rounds} interleaved rounds)", columns, echo_table(rows, mode))
        node_rows: list[dict[str, Any]] = []
        if not args.no_node:
            from ._quic_node import node_table, run_node

            node_rows = run_node(libraries, work, repeats)
            print_table(*node_table(node_rows))
        paced = [] if args.no_paced else run_paced(libraries, rounds, 60 if args.quick else 150, work)
        _print_against_tcp(paced, f"Paced small calls, cross-process: {PACED_BODY // 1024} KB echo every "
                           f"{PACED_GAP_S * 1000:g} ms, median round trip and CPU ms of both ends per call (gaps "
                           f"included), each against the TCP echo at the same pace ({rounds} interleaved rounds)")
        occasional = [] if args.no_occasional else run_occasional(libraries, rounds, 10 if args.quick else 25, work)
        _print_against_tcp(occasional, f"Occasional calls (gossip's pattern), cross-process: a "
                           f"{OCCASIONAL_BODY // 1024} KB echo every {OCCASIONAL_GAP_S * 1000:g} ms, median time per "
                           f"call and CPU ms of both ends per call, against a TCP connection per call ({rounds} "
                           "interleaved rounds)")
        write_results("transport_quic", {"sizes": SIZES, "rounds": rounds, "repeats": repeats,
                                         "socket_buffers_granted": buffers, "echo": rows, "node": node_rows,
                                         "paced": paced, "occasional": occasional},
                      [headline(f"node moe/execute {r['size']} over QUIC ({r['library']})", r["quic"]["ms"], "ms",
                                reference="over HTTP", reference_value=r["http"]["ms"], target="QUIC ≤ HTTP")
                       for r in node_rows])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
