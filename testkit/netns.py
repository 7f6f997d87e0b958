"""Network namespaces on one bridge, for nodes that must not share a network stack.

`bridged_namespaces(n)` makes a Linux bridge with an address in this (the root) namespace and
`n` namespaces, each joined to the bridge by a veth pair and given its own address on the same
/24; every node is then a separate host on one Ethernet segment (MTU 1,500), reachable from
here and from each other, and reaches a service here (Redis, a relay of testkit/netem.py) at
the bridge's address. It needs root and iproute2 (`ip netns`, veth, bridge); where those are
missing it yields None and the caller runs on loopback. Everything it made is deleted on exit,
also after a failure half way.

Interface names carry this process's id, so two runs on one machine do not collide.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Subnet:
    bridge_ip: str  # this namespace's address on the bridge
    hosts: list[tuple[str, str]]  # (namespace name, its address), one per node

    def launcher(self, i: int) -> tuple[str, ...]:
        """The command-line prefix that runs a program inside namespace i."""
        return ("ip", "netns", "exec", self.hosts[i][0])

    def host(self, i: int) -> str:
        return self.hosts[i][1]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.215.x.0/24 no interface here uses (picked by pid, then the next free)."""
    used = [ipaddress.ip_interface(f"{a.address}/{a.netmask}").network
            for addrs in psutil.net_if_addrs().values() for a in addrs if a.family.name == "AF_INET" and a.netmask]
    for k in range(256):
        candidate = ipaddress.ip_network(f"10.215.{(os.getpid() + k) % 256}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise RuntimeError("no free 10.215.x.0/24")


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    return None


@contextlib.contextmanager
def bridged_namespaces(n: int) -> Iterator[Subnet | None]:
    """Yield a Subnet of n namespaces on one bridge, or None where none can be made (see available())."""
    if available() is not None:
        yield None
        return
    tag = f"tz{os.getpid() % 100000}"
    bridge = f"{tag}br"
    namespaces: list[str] = []
    made_bridge = False
    try:
        try:
            network = _free_subnet()
            addresses = list(network.hosts())
            _ip("link", "add", bridge, "type", "bridge")
            made_bridge = True
            _ip("addr", "add", f"{addresses[0]}/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
            hosts = []
            for i in range(n):
                ns, outer, inner = f"{tag}-{i}", f"{tag}h{i}", f"{tag}n{i}"
                _ip("netns", "add", ns)
                namespaces.append(ns)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "master", bridge)
                _ip("link", "set", outer, "up")
                address = str(addresses[1 + i])
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                hosts.append((ns, address))
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, RuntimeError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            print(f"network namespaces unavailable ({str(detail).strip()}): running on loopback")
            yield None
            return
        yield Subnet(str(addresses[0]), hosts)
    finally:
        for ns in namespaces:  # deleting a namespace deletes its end of the veth pair, and so the pair
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                _ip("netns", "del", ns)
        if made_bridge:
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                _ip("link", "del", bridge)
