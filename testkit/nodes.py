"""Real node processes on loopback, for the end-to-end tests and the benchmarks.

Each node gets free HTTP and QUIC ports, its own data dir and its own Redis database,
and is started with the real `tenzro node run` command line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import psutil
import redis

from apps.node.database import MIGRATED_WITH_FILE, migrate
from core.env import SQLITE_FILE

REDIS_HOST_URL = os.environ.get("TENZRO_TEST_REDIS_HOST", "redis://127.0.0.1:6379")
TOKEN = "e2e-operator-token"
START_TIMEOUT_S = 90.0


class Usage(NamedTuple):
    cpu_s: float  # CPU seconds, user + system
    involuntary_switches: int  # times the kernel took a core from one of their threads while it could still run


def usage_of(pids: Iterable[int]) -> Usage:
    """What the processes `pids` alive now have used so far (one that exits meanwhile is left out): their
    CPU seconds and how often they were preempted (a woken or busier task got the core)."""
    cpu_s, switches = 0.0, 0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            with process.oneshot():
                times = process.cpu_times()
                cpu_s += times.user + times.system
                switches += process.num_ctx_switches().involuntary
    return Usage(cpu_s, switches)


_template_dir: Path | None = None


def template_database() -> Path:
    """A data dir holding only a migrated database, made once per test process by the node's own
    migrate step (apps/node/database.py). A new node's data dir starts as a copy of it, so each of
    the suite's hundreds of node starts skips the ~3 s a fresh migrate costs; the migrations still
    run, here, once, and `make run` or a restarted node with new migrations runs them as always."""
    global _template_dir
    if _template_dir is None:
        root = Path(tempfile.mkdtemp(prefix="tenzro-migrated-"))
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        migrate(root, {**env, "TENZRO_DATA_DIR": str(root), "DJANGO_SETTINGS_MODULE": "tenzro_site.settings.base"})
        _template_dir = root
    return _template_dir


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class NodeProcess:
    data_dir: Path
    redis_db: int
    http_port: int = field(default_factory=lambda: free_port(socket.SOCK_STREAM))
    quic_port: int = field(default_factory=lambda: free_port(socket.SOCK_DGRAM))
    peers: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    # Run the node from another checkout of the project (a benchmark's "before"); default: this one.
    source_root: Path | None = None
    # Where it listens, and what its command line is prefixed with: a network namespace's address
    # and `ip netns exec NAME` (testkit/netns.py); default: loopback, no prefix.
    host: str = "127.0.0.1"
    launcher: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def redis_url(self) -> str:
        return f"{REDIS_HOST_URL}/{self.redis_db}"

    def start(self, **env_overrides: str) -> NodeProcess:
        redis.Redis.from_url(self.redis_url).flushdb()
        self.log_path = self.data_dir.with_suffix(".log")
        # Repair passes would re-replicate what a test loads once on purpose (it changes holders and
        # forwards mid-test): they are off unless a test asks for them (tests/e2e/test_repair.py).
        # The CPU backend unless a test asks for another: auto-detection would open the test machine's
        # only WebGPU adapter (lavapipe) in every node just to refuse it (~1 s, ~100 MB each);
        # tests/e2e/test_gpu_backend.py runs auto and a forced wgsl node.
        env = {**os.environ, "TENZRO_OPERATOR_TOKEN": TOKEN, "DJANGO_SETTINGS_MODULE": "tenzro_site.settings.base",
               "TENZRO_REPAIR_TICK_S": "86400", "TENZRO_EXPERT_BACKEND": "cpu", **env_overrides}
        if self.source_root is not None:  # its packages come first on sys.path, before this checkout's
            env["PYTHONPATH"] = str(self.source_root)
        elif not env.get("DATABASE_URL") and not (self.data_dir / SQLITE_FILE).exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            for name in (SQLITE_FILE, MIGRATED_WITH_FILE):
                shutil.copyfile(template_database() / name, self.data_dir / name)
        argv = [
            *self.launcher, sys.executable, "-m", "cli.main", "node", "run",
            "--http", f"{self.host}:{self.http_port}", "--quic", f"{self.host}:{self.quic_port}",
            "--data-dir", str(self.data_dir), "--redis-url", self.redis_url, "--peers", ",".join(self.peers),
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True, cwd=self.source_root)
        self.wait_ready()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def wait_ready(self) -> None:
        """Ready = the web answers and the worker answers through it."""
        deadline = time.monotonic() + START_TIMEOUT_S
        last_error: Any = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"node exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            try:
                status = self.rpc("tenzro_workerStatus", timeout=5)
                if "result" in status:
                    return
                last_error = status
            except httpx.HTTPError as exc:
                last_error = exc
            time.sleep(0.5)
        raise RuntimeError(f"node not ready after {START_TIMEOUT_S} s ({last_error}):\n{self.log()[-4000:]}")

    def rpc(self, method: str, params: Any = None, *, token: str | None = None, timeout: float = 30) -> dict:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        return httpx.post(f"{self.url}/rpc", json=body, headers=headers, timeout=timeout).json()

    def result(self, method: str, params: Any = None, *, token: str | None = None) -> Any:
        answer = self.rpc(method, params, token=token)
        assert "result" in answer, answer
        return answer["result"]

    def descendants(self) -> list[int]:
        """PIDs of every process this node started (children, grandchildren)."""
        assert self.process is not None
        try:
            return [p.pid for p in psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) used so far by this node's processes alive now, the leader with them."""
        return self.usage().cpu_s

    def usage(self) -> Usage:
        """What this node's processes alive now, the leader with them, have used so far (usage_of)."""
        return usage_of(self.pids())

    def pids(self) -> list[int]:
        """The leader's PID and every process it started."""
        assert self.process is not None
        return [self.process.pid, *self.descendants()]

    def kill(self, timeout_s: float = 15.0) -> None:
        """SIGKILL the node's whole process group and wait until none of its processes lives on: the
        leader exits first, and a start on the same ports before its children are gone finds the QUIC
        port still bound ("Address already in use")."""
        if self.process is None:
            return
        group = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + timeout_s
        while (left := _group_members(group)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            raise RuntimeError(f"processes {left} of node group {group} alive {timeout_s} s after SIGKILL")

    def stop(self, timeout_s: float = 40.0) -> int:
        self.terminate()
        return self.wait_stopped(timeout_s)

    def terminate(self) -> None:
        """Ask the node to stop (SIGTERM: its clean shutdown); wait_stopped() waits for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = 40.0) -> int:
        if self.process is None:
            return 0
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise


def _group_members(group: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group `group`."""
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == group:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def stop_all(nodes: list[NodeProcess], timeout_s: float = 40.0) -> None:
    """Stop nodes side by side: each clean shutdown takes seconds (its children end their work), and
    one after another a test's teardown paid them all in turn."""
    for node in nodes:
        node.terminate()
    errors = []
    for node in nodes:
        try:
            node.wait_stopped(timeout_s)
        except subprocess.TimeoutExpired as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
