"""Reading the node's configuration from the environment.

Every setting of the node comes from an environment variable with a documented default
(docs/operations.md lists them). This module is plain Python so the CLI's node runner,
which starts before Django, reads exactly the same values.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

BASE_DIR = Path(__file__).resolve().parent.parent  # the checkout: core/env.py is one level down

DEFAULT_HTTP = "127.0.0.1:8000"
DEFAULT_QUIC = "127.0.0.1:4433"
DEFAULT_DATA_DIR = "var/node"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_ROLES = "Router,ExpertHolder"
# The Celery queue of prepare jobs: the node's own Celery worker consumes it beside the default
# queue, and prepare workers on other hosts consume only it (docs/operations.md, "Running a
# network across machines"), so they never run the node's gossip, repair or settlement tasks.
PREPARE_QUEUE = "prepare"
# The operator token the node generates when TENZRO_OPERATOR_TOKEN is unset (in the data dir).
OPERATOR_TOKEN_FILE = "operator.token"
# The embedded database, in the data dir, unless DATABASE_URL names another.
SQLITE_FILE = "node.sqlite3"


def env_str(name: str, default: str) -> str:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def _env_number(name: str, default: T, cast: Callable[[str], T], kind: str) -> T:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be {kind}, got {raw!r}") from exc


def env_int(name: str, default: int) -> int:
    return _env_number(name, default, int, "an integer")


def env_float(name: str, default: float) -> float:
    return _env_number(name, default, float, "a number")


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"environment variable {name} must be a boolean (1/0, true/false), got {raw!r}")


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


def data_dir() -> Path:
    """The node's data directory (key, certificate, SQLite file, disk tier, blobs)."""
    path = Path(env_str("TENZRO_DATA_DIR", DEFAULT_DATA_DIR))
    if not path.is_absolute():
        path = BASE_DIR / path
    return path


def split_host_port(value: str, *, what: str) -> tuple[str, int]:
    """Parse "host:port" (IPv6 in brackets) into (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what} must look like HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def private_dir(path: Path) -> Path:
    """Create `path` (and its parents) if missing; a directory created here is 0700: the data
    dir holds the node key, the operator token and Django's secret."""
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def read_or_create_secret(path: Path, *, nbytes: int = 32) -> str:
    """Return the secret stored at `path`, creating it (mode 0600) on first use.

    Two processes of one node may race here on first start; O_EXCL makes exactly one
    of them write, and the loser reads what the winner wrote.
    """
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):
            text = path.read_text().strip()
            if text:
                return text

            time.sleep(0.02)
        raise RuntimeError(f"{path} exists but is empty") from None
    value = secrets.token_urlsafe(nbytes)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return value
