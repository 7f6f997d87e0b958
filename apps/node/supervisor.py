"""`tenzro node run`: start, supervise and stop all processes of one node.

Plain module (no Django import: it runs before any child has set Django up). The
supervisor migrates the database, creates the identity, then runs four children — the
ASGI web server, the expert worker, a Celery worker and Celery beat — each in its own
process group so a stop reaches their own children too (Celery's pool). Child output is
prefixed with the child's name. A child that dies is restarted with exponential backoff.
SIGINT/SIGTERM stop every child (SIGTERM to the child, then SIGKILL to its whole group after a
grace period).

Processes never outlive their node: each child is started through apps/node/parent_death.py,
so the kernel kills it if the supervisor dies without stopping it (SIGKILL, the OOM killer).
The supervisor also records its children in `<data dir>/node.pids`; a start on the same data
dir ends whatever a previous run left there (its pids checked against their start times, so
a recycled pid is never killed) before it checks the ports.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil
import redis

from apps.node import database, liveness
from apps.node.identity import load_or_create_identity
from core.env import (
    BASE_DIR,
    OPERATOR_TOKEN_FILE,
    PREPARE_QUEUE,
    env_bool,
    private_dir,
    read_or_create_secret,
    split_host_port,
)
from core.logs import Secrets, redact

STOP_GRACE_S = 15.0
PIDS_FILE = "node.pids"
METRICS_DIR = "metrics"
LEFTOVER_GRACE_S = 5.0
MAX_BACKOFF_S = 30.0
# A child that stayed up this long is considered healthy again: its backoff resets.
HEALTHY_AFTER_S = 60.0


class NodeStartError(RuntimeError):
    """The node cannot start (port taken, Redis down, data dir locked); the message says which."""


@dataclass(frozen=True)
class NodeOptions:
    http: str
    quic: str
    data_dir: Path
    peers: list[str]
    redis_url: str
    roles: list[str]
    celery_concurrency: int = 1
    expert_backend: str = "auto"
    memory_budget_bytes: int = 0  # 0: the node's share of the host's memory (core/experts/host_share.py)


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    state: str = "starting"
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 1.0
    restart_at: float = 0.0
    readers: list[threading.Thread] = field(default_factory=list)

    def snapshot(self, now: float) -> dict:
        alive = self.process is not None and self.process.poll() is None
        return {
            "name": self.name,
            "pid": self.process.pid if alive and self.process else None,
            "state": self.state,
            "uptime_s": round(now - self.started_at, 1) if alive else 0.0,
            "restarts": self.restarts,
        }


def child_environment(options: NodeOptions) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TENZRO_HTTP=options.http,
        TENZRO_QUIC=options.quic,
        TENZRO_DATA_DIR=str(options.data_dir),
        TENZRO_PEERS=",".join(options.peers),
        TENZRO_ROLES=",".join(options.roles),
        TENZRO_EXPERT_BACKEND=options.expert_backend,
        TENZRO_MEMORY_BUDGET_BYTES=str(options.memory_budget_bytes),
        REDIS_URL=options.redis_url,
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("DJANGO_SETTINGS_MODULE", "tenzro_site.settings.base")
    # Every child counts its metrics in files here; the web process's /metrics adds them up
    # (prometheus_client's multiprocess mode). Emptied at each start (Supervisor.prepare).
    env["PROMETHEUS_MULTIPROC_DIR"] = str(options.data_dir / METRICS_DIR)
    env.setdefault("TENZRO_PUBLIC_HTTP", f"http://{options.http}")
    # OpenBLAS and the compiled kernels keep thread pools; spinning idle threads of one pool
    # starve the other on small machines (measured ~20x slower tiled expert forwards).
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def child_commands(options: NodeOptions) -> list[Child]:
    host, port = split_host_port(options.http, what="--http")
    py = sys.executable
    beat_schedule = options.data_dir / "celerybeat-schedule"
    return [
        Child("web", [py, "-m", "uvicorn", "tenzro_site.asgi:application", "--host", host, "--port", str(port),
                      "--lifespan", "off", "--ws", "websockets-sansio", "--no-access-log",
                      "--timeout-graceful-shutdown", "5"]),
        Child("expert-worker", [py, "-m", "django", "expert_worker"]),
        Child("celery-worker", [py, "-m", "celery", "-A", "tenzro_site", "worker", "--loglevel", "INFO",
                                "--concurrency", str(options.celery_concurrency), "-n", f"node-{port}@%h",
                                # the default queue and, unless only other hosts prepare, the prepare jobs
                                "-Q", "celery" if not env_bool("TENZRO_PREPARE_ON_NODE", True)
                                else f"celery,{PREPARE_QUEUE}",
                                "--without-gossip", "--without-mingle"]),
        Child("celery-beat", [py, "-m", "celery", "-A", "tenzro_site.beat", "beat", "--loglevel", "INFO",
                              "-s", str(beat_schedule), "--pidfile="]),
    ]


def _check_port_free(address: str, *, what: str, kind: int) -> None:
    host, port = split_host_port(address, what=what)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as probe:
        if kind == socket.SOCK_STREAM:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise NodeStartError(f"{what} {address} is not available: {exc.strerror}") from exc


class Supervisor:
    def __init__(self, options: NodeOptions, *, out: IO[str] = sys.stdout) -> None:
        self.options = options
        self.out = out
        self.env = child_environment(options)
        self.children = child_commands(options)
        # Set from the signal handler, so a plain flag: a handler that took a lock (Event.set)
        # could interrupt the main thread while it holds that same lock and deadlock.
        self._stop_requested = False
        self._print_lock = threading.Lock()
        self._lock_handle: IO[str] | None = None
        self._redis = redis.Redis.from_url(options.redis_url, socket_timeout=2, socket_connect_timeout=2)
        # Every line the node prints passes here, children's raw output included: redact it again.
        self._secrets = Secrets(directory=options.data_dir)
        # TENZRO_LOG_FORMAT=json: the children write JSON lines themselves; the supervisor passes
        # them through and wraps its own lines and any raw child output the same way.
        self._json = os.environ.get("TENZRO_LOG_FORMAT", "text") == "json"
        self._node_id: str | None = None

    # -- output -------------------------------------------------------------------------------
    def log(self, name: str, line: str) -> None:
        line = redact(line.rstrip(), self._secrets.values())
        line = _json_line(name, line, node=self._node_id) if self._json else f"{name:<13}| {line}"
        with self._print_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def _pump(self, name: str, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            self.log(name, raw.decode(errors="replace"))
        stream.close()

    # -- preparation --------------------------------------------------------------------------
    def prepare(self) -> None:
        """Everything that must hold before a child starts; raises NodeStartError."""
        # 0700 even when the operator made the directory: it holds the node key and the tokens.
        private_dir(self.options.data_dir).chmod(0o700)
        self._lock_handle = open(self.options.data_dir / "node.lock", "w")  # noqa: SIM115 (held for the run)
        try:
            fcntl.flock(self._lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise NodeStartError(f"another node is already running with data dir {self.options.data_dir}") from exc
        self.end_leftovers()  # before the port checks: a leftover may still hold our ports
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            raise NodeStartError(
                f"Redis does not answer at {redact(self.options.redis_url, [])} ({exc}); start it (`make run` does) "
                "or pass --redis-url"
            ) from exc
        _check_port_free(self.options.http, what="--http", kind=socket.SOCK_STREAM)
        _check_port_free(self.options.quic, what="--quic", kind=socket.SOCK_DGRAM)
        identity = load_or_create_identity(self.options.data_dir)
        self._node_id = identity.provider_id
        self.log("node", f"provider id {identity.provider_id}")
        self.log("node", f"QUIC certificate sha256 {identity.cert_sha256}")
        if not os.environ.get("TENZRO_OPERATOR_TOKEN"):
            # Created now (not on the first request) so the local CLI can read it at once.
            read_or_create_secret(self.options.data_dir / OPERATOR_TOKEN_FILE)
            self.log("node", f"operator token in {self.options.data_dir / OPERATOR_TOKEN_FILE}")
        _empty_metrics_dir(self.options.data_dir / METRICS_DIR)
        try:
            migrated = database.migrate(self.options.data_dir, self.env)
        except database.MigrationError as exc:
            raise NodeStartError(f"database migration failed:\n{exc}") from exc
        self.log("node", "database migrated" if migrated else "database up to date (no migration pending)")

    def end_leftovers(self) -> list[int]:
        """End the process groups a previous run of this data dir left behind; their pids."""
        ended = end_recorded_processes(self.options.data_dir / PIDS_FILE)
        if ended:
            self.log("node", f"ended {len(ended)} processes a previous run of this data dir left behind: "
                             f"pids {', '.join(map(str, ended))}")
        return ended

    def _record_pids(self) -> None:
        """Write node.pids: every live child with its start time (so a recycled pid is never taken)."""
        entries = []
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                with contextlib.suppress(psutil.Error):
                    created = psutil.Process(child.process.pid).create_time()
                    entries.append({"name": child.name, "pid": child.process.pid, "create_time": created})
        path = self.options.data_dir / PIDS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"supervisor": os.getpid(), "children": entries}))
        os.replace(tmp, path)

    # -- children -----------------------------------------------------------------------------
    def _start(self, child: Child) -> None:
        # Through the parent_death launcher: the child dies with this supervisor, however it dies.
        argv = [sys.executable, "-m", "apps.node.parent_death", str(os.getpid()), "--", *child.argv]
        child.process = subprocess.Popen(
            argv, env={**self.env, "TENZRO_PROCESS_ROLE": child.name}, cwd=BASE_DIR, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        child.state, child.started_at = "running", time.time()
        reader = threading.Thread(target=self._pump, args=(child.name, child.process.stdout), daemon=True)
        reader.start()
        child.readers.append(reader)
        self.log("node", f"started {child.name} (pid {child.process.pid})")
        self._record_pids()

    def _check(self, child: Child, now: float) -> None:
        if child.state == "restarting":
            if now >= child.restart_at:
                child.restarts += 1
                self._start(child)
            return
        assert child.process is not None
        code = child.process.poll()
        if code is None:
            if now - child.started_at > HEALTHY_AFTER_S:
                child.backoff_s = 1.0
            return
        # The child is gone; make sure nothing of its group lingers before restarting it.
        _kill_group(child.process.pid, signal.SIGKILL)
        _metrics_process_dead(self.options.data_dir / METRICS_DIR, child.process.pid)
        child.state, child.restart_at = "restarting", now + child.backoff_s
        self.log("node", f"{child.name} exited with code {code}; restarting in {child.backoff_s:.0f} s")
        child.backoff_s = min(child.backoff_s * 2, MAX_BACKOFF_S)

    def _publish(self, now: float) -> None:
        try:
            liveness.write_processes(self._redis, [child.snapshot(now) for child in self.children])
        except redis.RedisError as exc:
            self.log("node", f"could not record process states in Redis: {exc}")

    def request_stop(self, *_: object) -> None:
        self._stop_requested = True

    def run(self) -> int:
        """Prepare, start the children and supervise them until asked to stop."""
        self.prepare()
        for child in self.children:
            self._start(child)
        self.log("node", f"node up: http://{self.options.http}  quic {self.options.quic}")
        next_publish = 0.0
        while not self._stop_requested:
            time.sleep(0.2)
            now = time.time()
            for child in self.children:
                self._check(child, now)
            if now >= next_publish:
                self._publish(now)
                next_publish = now + liveness.SUPERVISOR_INTERVAL_S
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        self.log("node", "stopping")
        running = [c for c in self.children if c.process is not None and c.process.poll() is None]
        for child in running:
            child.state = "stopping"
            # The child alone, not its group: Celery's main process stops its pool processes itself (a
            # pool process that got SIGTERM too dies under its task, and the worker logs WorkerLostError).
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, signal.SIGTERM)
        deadline = time.time() + STOP_GRACE_S
        for child in running:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.log("node", f"{child.name} did not stop within {STOP_GRACE_S:.0f} s; killing it")
        for child in self.children:
            if child.process is not None:
                # SIGKILL the whole group: it also reaps grandchildren (Celery pool processes).
                _kill_group(child.process.pid, signal.SIGKILL)
                child.process.wait()
                child.state = "exited"
            for reader in child.readers:
                reader.join(timeout=2)
        with contextlib.suppress(redis.RedisError):
            liveness.clear_processes(self._redis)
        (self.options.data_dir / PIDS_FILE).unlink(missing_ok=True)
        self.log("node", "stopped")
        if self._lock_handle is not None:
            self._lock_handle.close()


def _json_line(name: str, line: str, *, node: str | None) -> str:
    """A child's JSON log line as it is; anything else (the supervisor's own lines, a child's raw
    output) as a JSON object of the same shape (core/logs.py, JsonFormatter)."""
    if line.startswith("{") and line.endswith("}"):
        return line
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    return json.dumps({"ts": now, "level": "INFO", "logger": "tenzro.supervisor" if name == "node" else "stdout",
                       "role": "supervisor" if name == "node" else name, "node": node, "pid": os.getpid(),
                       "message": line}, ensure_ascii=False)


def _empty_metrics_dir(path: Path) -> None:
    """A fresh multiprocess metrics dir: files a previous run left would be added to this run's."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700, parents=True)


def _metrics_process_dead(path: Path, pid: int) -> None:
    """Drop a dead child's live gauges (its counters stay: they still count what it did).
    The child runs through the parent_death launcher, which execs it: same pid."""
    from prometheus_client import multiprocess  # here: only a restart needs it

    with contextlib.suppress(OSError):
        multiprocess.mark_process_dead(pid, str(path))


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def end_recorded_processes(pids_file: Path, *, grace_s: float = LEFTOVER_GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL, the process groups recorded in `pids_file` that are still the same
    processes (same pid and start time); returns their pids. A missing or torn file ends nothing."""
    try:
        entries = json.loads(pids_file.read_text()).get("children", [])
    except (OSError, ValueError, AttributeError):
        return []
    alive: list[psutil.Process] = []
    for entry in entries:
        try:
            process = psutil.Process(int(entry["pid"]))
            if abs(process.create_time() - float(entry["create_time"])) < 0.01:
                alive.append(process)
        except (psutil.Error, KeyError, TypeError, ValueError):
            continue
    for process in alive:
        _kill_group(process.pid, signal.SIGTERM)  # each child leads its own group (start_new_session)
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for process in still:
        _kill_group(process.pid, signal.SIGKILL)
    psutil.wait_procs(still, timeout=grace_s)
    return [process.pid for process in alive]


def run_node(options: NodeOptions) -> int:
    supervisor = Supervisor(options)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    try:
        return supervisor.run()
    except NodeStartError as exc:
        print(f"tenzro: cannot start the node: {exc}", file=sys.stderr)
        return 1
