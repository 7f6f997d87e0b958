"""A Redis server of one's own, for runs that must not share databases with anyone.

The e2e tests give their nodes Redis databases 1-14 of the shared server in turn, and a
node's Channels layer lives in its database: two nodes on the same database (say a
benchmark's and a test's, run at the same time on one machine) take each other's worker
calls — an expert load answered by the other node's worker, a status read from the wrong
runtime. `private_redis()` starts Debian's `redis-server` on a free port, in memory only,
as a child of this process, and stops it (that pid only) on exit. `RedisNode` is a
NodeProcess whose database lives on such a server.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from testkit.nodes import REDIS_HOST_URL, NodeProcess, free_port


@contextlib.contextmanager
def private_redis(timeout_s: float = 10.0, host: str = "127.0.0.1") -> Iterator[str]:
    """Yield `redis://<host>:<port>` of a fresh server (no persistence); RuntimeError if none starts.

    `host`: the address it listens on (a bridge's, for nodes in network namespaces: testkit/netns.py)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (scripts/ensure-redis.sh installs Debian's)")
    port = free_port(socket.SOCK_STREAM)
    with tempfile.TemporaryDirectory(prefix="tenzro-redis-") as work:
        process = subprocess.Popen(
            [binary, "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no",
             "--dir", work, "--logfile", "",
             # protected mode refuses non-loopback clients without a password; a bridge address is
             # reachable only from this machine's own namespaces (testkit/netns.py)
             *(["--protected-mode", "no"] if host != "127.0.0.1" else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://{host}:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if redis.Redis.from_url(url, socket_timeout=1).ping():
                        break
                except redis.ConnectionError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not come up")
                time.sleep(0.05)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class RedisNode(NodeProcess):
    """A NodeProcess whose Redis database is on `redis_host` (e.g. a private_redis() server)."""

    redis_host: str = REDIS_HOST_URL

    @property
    def redis_url(self) -> str:
        return f"{self.redis_host}/{self.redis_db}"
