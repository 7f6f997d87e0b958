"""UDP facts the QUIC transport sizes itself by: the path MTU and the socket buffers.

A QUIC datagram must fit the path in one IP packet (QUIC forbids IP fragmentation), so
the largest datagram is the path MTU less the IP and UDP headers. Bigger datagrams mean
fewer packets, ACKs, syscalls and AEAD calls per byte, which is most of the cost of moving
megabytes through a Python QUIC stack (docs/operations.md, "Benchmarks"). Loopback carries
65,536-byte packets; an Ethernet LAN 1,500; the Internet often less.

Socket buffers: a burst of large datagrams overflows the kernel's default receive buffer
(~208 KiB) and the lost packets cost a loss-recovery round each; we ask for more and report
what the kernel granted (Linux caps the request at net.core.rmem_max / wmem_max and reports
twice the granted size, its bookkeeping overhead included).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass
from typing import Any

import psutil

# Linux <linux/in.h> IP_MTU and <linux/in6.h> IPV6_MTU: the MTU of a connected socket's route,
# including what path-MTU discovery learned from ICMP. Python's socket module lacks both names.
_IP_MTU = getattr(socket, "IP_MTU", 14)
_IPV6_MTU = getattr(socket, "IPV6_MTU", 24)
IPV4_UDP_OVERHEAD = 20 + 8
IPV6_UDP_OVERHEAD = 40 + 8
logger = logging.getLogger(__name__)


def _is_v4(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return True  # a name: resolved by the caller's family; IPv4 is the smaller overhead's other case
    return address.version == 4 or (address.version == 6 and address.ipv4_mapped is not None)


def route_mtu(host: str, port: int) -> int | None:
    """MTU of the route to `host` (an IP address), as the kernel knows it now; None if unknown.

    Connecting a UDP socket sends nothing; it only makes the kernel pick the route, whose
    MTU (lowered by any ICMP "packet too big" it has seen) IP_MTU then reports.
    """
    family = socket.AF_INET if _is_v4(host) else socket.AF_INET6
    target = host.removeprefix("::ffff:") if family == socket.AF_INET else host
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((target, port))
            if family == socket.AF_INET:
                return int(probe.getsockopt(socket.IPPROTO_IP, _IP_MTU))
            return int(probe.getsockopt(socket.IPPROTO_IPV6, _IPV6_MTU))
    except OSError:
        return None


def interface_mtu(host: str) -> int | None:
    """MTU of the interface that owns `host` (a listen address); None if no interface has it.

    A wildcard address listens on every interface, so it gets the smallest MTU among the
    interfaces that are up and have an address (loopback only when nothing else is up): the
    server's datagrams must fit whichever interface a peer comes in on.
    """
    addresses = psutil.net_if_addrs()
    stats = psutil.net_if_stats()
    up = {name for name, stat in stats.items() if stat.isup and stat.mtu > 0 and addresses.get(name)}
    wanted = host.strip("[]").removeprefix("::ffff:")
    if wanted in ("", "0.0.0.0", "::"):
        external = {name for name in up if not _is_loopback(addresses[name])}
        chosen = external or up
        return min((stats[name].mtu for name in chosen), default=None)
    for name in up:
        if any(entry.address.split("%")[0] == wanted for entry in addresses[name]):
            return stats[name].mtu
    return None


def _is_loopback(entries: list[Any]) -> bool:
    for entry in entries:
        try:
            if ipaddress.ip_address(entry.address.split("%")[0]).is_loopback:
                return True
        except ValueError:
            continue  # a link-layer address
    return False


def datagram_size_for(mtu: int | None, host: str, *, ceiling: int, configured: int = 0) -> int:
    """The QUIC datagram size to use towards `host`.

    `configured` > 0 is the operator's choice and wins (still capped by the library's
    ceiling); otherwise the path MTU less IP+UDP headers, capped by `ceiling`; 1,200 bytes
    (QUIC's minimum, which every path must carry) when the MTU is unknown.
    """
    if configured > 0:
        return max(1200, min(configured, ceiling))
    if mtu is None:
        return 1200
    overhead = IPV4_UDP_OVERHEAD if _is_v4(host) else IPV6_UDP_OVERHEAD
    return max(1200, min(mtu - overhead, ceiling))


@dataclass(frozen=True)
class SocketBuffers:
    requested: int
    receive: int  # what getsockopt reports after the request (Linux: twice the granted bytes)
    send: int


def tune_socket(sock: Any, buffer_bytes: int) -> SocketBuffers | None:
    """Ask for `buffer_bytes` of receive and send buffer on a UDP socket; say what was granted.

    `sock` is a socket or asyncio's TransportSocket. 0 leaves the kernel's defaults.
    """
    if sock is None:
        return None
    if buffer_bytes > 0:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, buffer_bytes)
            except OSError:  # refused outright (not capped): keep the default and say so below
                logger.debug("setsockopt(%s, %d) refused", option, buffer_bytes, exc_info=True)
    granted = SocketBuffers(requested=buffer_bytes,
                            receive=int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)),
                            send=int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)))
    if buffer_bytes > 0 and granted.receive < buffer_bytes:
        logger.info("UDP receive buffer: asked for %d bytes, the kernel granted %d (raise net.core.rmem_max)",
                    buffer_bytes, granted.receive)
    return granted
