"""The transport alone, for bench/netem.py (a helper: `make bench` skips _-modules).

The bytes each holder's requests and answers carried in a condition's forwards (their medians), moved
by QUIC alone: two echo servers in child processes (the node's own peer-door server, bench/_quic_echo.py,
answering the size it is asked), each behind a relay of its own with the condition's impairment, as the
two holders are, called by a QuicPool with the nodes' settings and cut over the lanes the pool offers,
as the forward cuts a holder's request. The client and the servers run in processes of their own; the
relays stay on the benchmark's relay thread, as the nodes' do. No gate, plan, compute, codec or receipt:
what this takes is the QUIC library's (loss recovery, congestion control) and the relay's; what the
forward takes beyond it is ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from apps.forward.lanes import lane_weights
from bench._quic_echo import ROOT, echo_child
from core.transport import quic_lib
from core.transport.pool import QuicPool
from core.transport.quic import QuicSettings
from core.transport.udp import datagram_size_for, route_mtu
from testkit.impaired import ImpairedNetwork, free_udp_port
from testkit.netem import Impairment

ETHERNET_MTU = 1500  # the namespaces' veth links (testkit/netns.py)


def nodes_datagram_size(network: ImpairedNetwork, library: str) -> int:
    """The datagram size the nodes use toward the relays: an Ethernet path's between namespaces, loopback's
    without them (this process reaches the relays' address, the bridge's, over its own loopback)."""
    mtu = route_mtu("127.0.0.1", 9) if network.relay_host == "127.0.0.1" else ETHERNET_MTU
    return datagram_size_for(mtu, network.relay_host, ceiling=quic_lib.load(library).max_datagram_size)


def holder_bytes(holders: list[list[dict[str, Any]]]) -> list[tuple[int, int]]:
    """Per holder (in order of the bytes they received), the median (bytes sent to it, bytes received from
    it) over the forwards; `holders` as bench/netem.py records them (per forward, per holder)."""
    ranked = [sorted((h["bytes_received"] or 0, h["bytes_sent"] or 0) for h in forward) for forward in holders]
    width = max((len(r) for r in ranked), default=0)
    out = []
    for i in range(width):
        at = [r[i] for r in ranked if len(r) > i]
        out.append((round(statistics.median(s for _, s in at)), round(statistics.median(r for r, _ in at))))
    return out


def measure(network: ImpairedNetwork, impairment: Impairment, exchanges: list[tuple[int, int]], *, library: str,
            congestion: str, datagram_size: int, cert: str, key: str, pin: str, repeats: int, warmup: int,
            warmup_s: float) -> list[float]:
    """ms per round: every (bytes up, bytes down) of `exchanges` at once, one echo server each, after at least
    `warmup` untimed rounds and `warmup_s` of them, as the forwards are timed: a connection's congestion
    window under loss is what its history left it (a fresh one is still in slow start). The relays
    stay on the network's relay thread in this process; the client runs in a child process and the
    servers in its children, so that none of them takes the GIL from the relays (the nodes do not)."""
    ports = [free_udp_port("127.0.0.1") for _ in exchanges]
    relays = [network.relays.add(listen=(network.relay_host, 0), target=("127.0.0.1", port), impairment=impairment,
                                 seed=100 + i, upstream_host="127.0.0.1") for i, port in enumerate(ports)]
    job = {"spec": {"library": library, "congestion_control": congestion, "max_datagram_size": datagram_size},
           "cert": cert, "key": key, "pin": pin, "repeats": repeats, "warmup": warmup, "warmup_s": warmup_s,
           "host": network.relay_host,
           "servers": ports, "paths": [[relay.listen[1], up, down] for relay, (up, down) in zip(relays, exchanges,
                                                                                                 strict=True)]}
    try:
        done = subprocess.run([sys.executable, "-m", "bench._netem_quic", json.dumps(job)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the QUIC-alone client failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for relay in relays:
            network.relays.call(relay.close)
            network.relays.relays.remove(relay)


async def _rounds(job: dict[str, Any]) -> list[float]:
    """The child's work (`python -m bench._netem_quic JOB`): echo servers on `servers`, rounds through `paths`."""
    host, pin = job["host"], job["pin"]
    async with contextlib.AsyncExitStack() as stack:
        for port in job["servers"]:
            await stack.enter_async_context(echo_child(job["spec"], job["cert"], job["key"], port))
        pool = QuicPool(QuicSettings(max_body=64 << 20, **{k: v for k, v in job["spec"].items() if v}))
        stack.push_async_callback(pool.close)

        async def exchange(port: int, up: int, down: int) -> None:
            # as the forward: lanes asked for by the answer's size (its rows are the request's pairs), the
            # bytes cut in proportion to the lanes' windows (apps/forward/lanes.py)
            lanes = pool.lanes_for(host=host, port=port, pin_sha256=pin, nbytes=down)
            weights = lane_weights([window for _, window in lanes])
            shares = [w / sum(weights) for w in weights]
            await asyncio.gather(*(pool.call(host=host, port=port, pin_sha256=pin, method="echo",
                                             params={"answer_bytes": round(down * share)},
                                             body=bytes(round(up * share)), timeout_s=60, lane=lane)
                                   for (lane, _), share in zip(lanes, shares, strict=True)))

        async def one_round() -> float:
            started = time.perf_counter()
            await asyncio.gather(*(exchange(port, up, down) for port, up, down in job["paths"]))
            return (time.perf_counter() - started) * 1e3

        started, warmups = time.monotonic(), 0
        while warmups < job["warmup"] or time.monotonic() - started < job["warmup_s"]:
            await one_round()
            warmups += 1
        return [await one_round() for _ in range(job["repeats"])]


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_rounds(json.loads(sys.argv[1])))))
