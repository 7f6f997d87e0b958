"""A Redis server of one's own, for runs that must not share databases with anyone.

The e2e tests give their nodes Redis databases 1-14 of the shared server in turn, and a
node's worker mailboxes live in its database: two nodes on the same database (say a
benchmark's and a test's, run at the same time on one machine) take each other's worker
calls — an expert load answered by the other node's worker, a status read from the wrong
runtime. `private_redis()` starts Debian's `redis-server` on a free port, in memory only,
as a child of this process, and stops it (that pid only) on exit. `RedisNode` is a
NodeProcess whose database lives on such a server. `RedisServer` is the same server as an
object that can be stopped and started again on its port (the fault suite drops a node's
Redis for a few seconds: tests/e2e/test_faults.py).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from testkit.nodes import REDIS_HOST_URL, NodeProcess, free_port


@dataclass
class RedisServer:
    """Debian's redis-server on one loopback port, in memory only; `stop()` then `start()` drops
    every connection and every key, as a crashed and restarted Redis would."""

    port: int = field(default_factory=lambda: free_port(socket.SOCK_STREAM))
    host: str = "127.0.0.1"
    process: subprocess.Popen | None = None
    _work: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/ensure-redis.sh installs Debian's)")
        if self._work is None:
            self._work = tempfile.TemporaryDirectory(prefix="tenzro-redis-")
        self.process = subprocess.Popen(
            [binary, "--bind", self.host, "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", self._work.name, "--logfile", "",
             # protected mode refuses non-loopback clients without a password; a bridge address is
             # reachable only from this machine's own namespaces (testkit/netns.py)
             *(["--protected-mode", "no"] if self.host != "127.0.0.1" else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if redis.Redis.from_url(self.url, socket_timeout=1).ping():
                    return self
            except redis.ConnectionError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not come up")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGKILL (no goodbye to clients, as a crash), then wait for the port to be released."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        if self._work is not None:
            self._work.cleanup()
            self._work = None


@contextlib.contextmanager
def private_redis(timeout_s: float = 10.0, host: str = "127.0.0.1") -> Iterator[str]:
    """Yield `redis://<host>:<port>` of a fresh server (no persistence); RuntimeError if none starts.

    `host`: the address it listens on (a bridge's, for nodes in network namespaces: testkit/netns.py)."""
    server = RedisServer(host=host)
    try:
        yield server.start(timeout_s).url
    finally:
        server.close()


@dataclass
class RedisNode(NodeProcess):
    """A NodeProcess whose Redis database is on `redis_host` (e.g. a private_redis() server)."""

    redis_host: str = REDIS_HOST_URL

    @property
    def redis_url(self) -> str:
        return f"{self.redis_host}/{self.redis_db}"
