"""A Redis server of its own for every pytest-xdist worker but the first (a pytest plugin).

`make test` runs the suite on two xdist workers. The e2e fixtures give their nodes Redis
databases 1-14 of `TENZRO_TEST_REDIS_HOST` in turn and the in-process tests use database 15;
two workers sharing one server would hand the same database to two live nodes, whose
worker mailboxes would then take each other's worker calls. So worker gw0 keeps the
shared server (the one `.ci/run` makes sure is running) and every other worker starts
Debian's `redis-server` on a free port, in memory only, for its whole session.

Loaded with `-p testkit.xdist_redis` (pyproject's addopts), before pytest-django reads the
settings: the environment must name the worker's server before `tenzro_site.settings.test`
is imported, and before `testkit.nodes` reads `TENZRO_TEST_REDIS_HOST`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time

_worker = os.environ.get("PYTEST_XDIST_WORKER")


def _start_private_redis(timeout_s: float = 15.0) -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (scripts/ensure-redis.sh installs Debian's)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    work = tempfile.mkdtemp(prefix=f"tenzro-redis-{_worker}-")
    process = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", work],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(work, ignore_errors=True)

    atexit.register(stop)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # PING by hand: no client library is imported this early
        if process.poll() is not None:
            raise RuntimeError(f"redis-server for xdist worker {_worker} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return f"redis://127.0.0.1:{port}"
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"redis-server for xdist worker {_worker} did not answer on port {port}")


if _worker not in (None, "gw0"):
    _url = _start_private_redis()
    os.environ["TENZRO_TEST_REDIS_HOST"] = _url
    os.environ["TENZRO_TEST_REDIS_URL"] = f"{_url}/15"
    os.environ["REDIS_URL"] = f"{_url}/15"
