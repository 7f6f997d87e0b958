"""Real nodes whose QUIC doors are reached through netem relays, in network namespaces where possible.

`impaired_network(n, work, env)` starts n nodes (`tenzro node run`), node 0 first in every
other's `--peers`, each in a network namespace of its own on one bridge (testkit/netns.py) or,
where namespaces cannot be made, on loopback. In front of each node's QUIC door sits a relay of
testkit/netem.py on this side of the bridge; the node advertises the relay's address as its
QUIC endpoint (`TENZRO_PUBLIC_QUIC`; its certificate pin stays its own, the relay only moves
datagrams), so every QUIC exchange between two nodes — gossip, the dial-back, the forward's
batches — crosses one relay, impaired both ways: the RTT between a router and a holder gains
twice the one-way delay. HTTP (JSON-RPC from the test, the HTTP fallback) is not impaired.
Their Redis is a private server on the bridge's address.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from testkit.netem import Impairment, PingResult, RelayThread, UdpEcho, udp_ping
from testkit.netns import bridged_namespaces
from testkit.nodes import NodeProcess
from testkit.redis_server import RedisNode, private_redis


@dataclass
class ImpairedNetwork:
    nodes: list[NodeProcess]
    relays: RelayThread
    topology: str  # what the nodes run in, in words
    relay_host: str

    def set(self, impairment: Impairment, *, node: int | None = None) -> None:
        """Apply `impairment` to every node's relay, or to node `node`'s only (in both directions), from the
        next datagram on."""
        self.relays.set_impairment(impairment, relay=node)  # relay i is node i's: they were added in order

    def ping(self, impairment: Impairment, *, count: int = 200, interval_s: float = 0.005) -> PingResult:
        """The reference: a plain UDP ping through a relay of its own with `impairment` (the RTT it adds)."""
        echo = UdpEcho(self.relay_host)
        relay = self.relays.add(listen=(self.relay_host, 0), target=echo.address, impairment=impairment, seed=99)
        try:
            return udp_ping(relay.listen, count=count, interval_s=interval_s, source_host=self.relay_host)
        finally:
            self.relays.call(relay.close)
            self.relays.relays.remove(relay)
            echo.close()


def free_udp_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def impaired_network(n: int, work: Path, env: dict[str, str], *, impairment: Impairment | None = None,
                     use_namespaces: bool = True) -> Iterator[ImpairedNetwork]:
    """Start n nodes behind relays (see the module docstring); stop them and undo everything on exit."""
    impairment = impairment or Impairment()
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        subnet = stack.enter_context(bridged_namespaces(n)) if use_namespaces else None
        relay_host = subnet.bridge_ip if subnet else "127.0.0.1"
        redis_host = stack.enter_context(private_redis(host=relay_host))
        relays = stack.enter_context(RelayThread())
        nodes: list[NodeProcess] = []
        envs = []
        for i in range(n):
            host = subnet.host(i) if subnet else "127.0.0.1"
            node = RedisNode(data_dir=work / f"node{i}", redis_db=1 + i, redis_host=redis_host, host=host,
                             launcher=subnet.launcher(i) if subnet else (), peers=[nodes[0].url] if nodes else [])
            if subnet:  # a fresh namespace: every port is free there
                node.http_port, node.quic_port = 8000, 4433
            relay = relays.add(listen=(relay_host, free_udp_port(relay_host)), target=(host, node.quic_port),
                               impairment=impairment, seed=i)
            nodes.append(node)
            envs.append({**env, "TENZRO_PUBLIC_QUIC": f"{relay_host}:{relay.listen[1]}",
                         "DJANGO_ALLOWED_HOSTS": f"{host},127.0.0.1,localhost",
                         # the relay is on another host than the node (the bridge's address), as
                         # behind address translation: peers must dial back an endpoint not the asker's
                         "TENZRO_DIALBACK_ANY_HOST": "1" if subnet else "0"})
        topology = (f"{n} network namespaces on one bridge ({subnet.bridge_ip}/24, veth, MTU 1500)" if subnet
                    else f"{n} nodes on loopback")
        try:
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(lambda pair: pair[0].start(**pair[1]), zip(nodes, envs, strict=True)))
            yield ImpairedNetwork(nodes, relays, topology, relay_host)
        finally:
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(_stop, nodes))


def _stop(node: NodeProcess) -> None:
    try:
        node.stop()
    except Exception as exc:  # a node that would not stop was killed; say so, keep cleaning up
        print(f"node {node.url} did not stop cleanly: {exc}")
