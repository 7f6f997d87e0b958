"""Logging of every process of a node: secrets redacted, text or one JSON object per line.

Plain module (no Django import): settings LOGGING names these classes, and every process of a
node (web, expert worker, Celery worker and beat, `manage.py` commands) configures logging
from those settings, so one filter on the console handler sees every record any of them
writes, its own and its libraries' (uvicorn's and Celery's loggers are routed to the same
handler in settings).

What is redacted (docs/security.md, "Secrets never logged"):
* the operator token (TENZRO_OPERATOR_TOKEN, else `<data dir>/operator.token`),
* the node's private key (`node.key`, a 32-byte ed25519 seed) in hex and base64,
* Django's secret key,
* the value of any `Authorization` header and any `Bearer <token>`,
* the password of any URL (`postgres://user:PASSWORD@host`, `redis://:PASSWORD@host`).

The secrets are read lazily, once per process, from the environment and the data dir: the
supervisor writes the token and key before any child starts, so a child's first record
already knows them.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from core.env import OPERATOR_TOKEN_FILE, data_dir

REDACTED = "[redacted]"
KEY_FILE = "node.key"  # apps/node/identity.py's KEY_FILE (not imported: this module loads before Django apps)

# `Authorization: <anything up to the end of the value>` in headers, dict reprs and curl lines.
_AUTHORIZATION = re.compile(r"""(?i)(authorization['"]?\s*[:=]\s*['"]?)([^'",\r\n}]+)""")
_BEARER = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9._~+/=-]{4,})")
# scheme://[user]:password@host — the password is whatever lies between the first ':' after
# the scheme's '//' and the last '@' before the host.
_URL_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)([^@\s/]+)(@)")

# The attributes every LogRecord has; anything else on a record is an `extra`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


class Secrets:
    """The literal secrets of this node, read once (and again while one is still missing)."""

    # While a secret is still missing (a process that started before the supervisor wrote it),
    # look again at most this often rather than on every record.
    RETRY_S = 1.0

    def __init__(self, *, extra: tuple[str, ...] = (), directory: Path | None = None) -> None:
        self._directory = directory  # the node's data dir; None: TENZRO_DATA_DIR (read when loading)
        self._values: list[str] | None = None
        self._complete = False
        self._loaded_at = 0.0
        self._extra = extra

    def values(self) -> list[str]:
        if self._values is None or (not self._complete and time.monotonic() - self._loaded_at >= self.RETRY_S):
            self._values, self._complete = self._load()
            self._loaded_at = time.monotonic()
        return self._values

    def _load(self) -> tuple[list[str], bool]:
        found: list[str] = list(self._extra)
        complete = True
        home = self._directory or data_dir()
        token = os.environ.get("TENZRO_OPERATOR_TOKEN")
        if not token:
            raw = _read(home / OPERATOR_TOKEN_FILE)
            token = raw.decode(errors="replace").strip() if raw else None
            complete = complete and bool(token)
        seed = _read(home / KEY_FILE)
        if seed and len(seed) == 32:
            found += [seed.hex(), base64.b64encode(seed).decode(), base64.urlsafe_b64encode(seed).decode()]
        else:
            complete = False
        secret_key = os.environ.get("DJANGO_SECRET_KEY") or (_read(home / "django.secret") or b"").decode(
            errors="replace").strip()
        found += [v for v in (token, secret_key) if v]
        # Longest first, so a secret that contains another is replaced whole; very short values
        # (a test's "x") would shred every message, so they are not treated as secrets.
        return sorted({v for v in found if len(v) >= 8}, key=len, reverse=True), complete


def redact(text: str, secrets: list[str]) -> str:
    """`text` with every secret and every credential-looking value replaced by [redacted]."""
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    text = _AUTHORIZATION.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


class RedactSecrets(logging.Filter):
    """Rewrites each record so no secret reaches a handler: the message (with its args merged
    in), the exception's text, the stack and every string `extra`. Never drops a record."""

    def __init__(self, name: str = "", *, secrets: Secrets | None = None) -> None:
        super().__init__(name)
        self.secrets = secrets or Secrets()

    def filter(self, record: logging.LogRecord) -> bool:
        values = self.secrets.values()
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as logging does
            return True
        record.msg, record.args = redact(message, values), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, values)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, values)
        for name, value in list(vars(record).items()):
            if name not in _STANDARD_ATTRS and isinstance(value, str):
                setattr(record, name, redact(value, values))
        return True


def process_role() -> str:
    """Which process of a node this is: the supervisor names each child (TENZRO_PROCESS_ROLE);
    otherwise it is guessed from the command line."""
    role = os.environ.get("TENZRO_PROCESS_ROLE")
    if role:
        return role
    argv = " ".join(sys.argv)
    if "uvicorn" in argv or "daphne" in argv:
        return "web"
    if "expert_worker" in argv:
        return "expert-worker"
    if "celery" in argv:
        return "celery-beat" if " beat" in argv else "celery-worker"
    return "manage"


_node_id: str | None = None


def node_id() -> str | None:
    """This node's provider id (hex public key), once its key exists."""
    global _node_id
    if _node_id is None:
        seed = _read(data_dir() / KEY_FILE)
        if seed and len(seed) == 32:
            from nacl.signing import SigningKey

            _node_id = SigningKey(seed).verify_key.encode().hex()
    return _node_id


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, role, node, pid, message, exception, extras."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.role = process_role()

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "role": self.role,
            "node": node_id(),
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}
        if extras:
            entry["extra"] = extras
        return json.dumps(entry, default=str, ensure_ascii=False)


class QuietNormalCloses(logging.Filter):
    """qh3 logs every connection its peer closes at WARNING ("Native peer close"), ~35 a minute on a
    gossiping node; a close with error code 0 is the normal end of a connection, so it becomes a
    DEBUG record (kept only when the node logs at DEBUG). A close with an error stays a WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        native = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if (record.msg == "Native peer close: %r" and isinstance(native, tuple) and len(native) >= 3
                and native[2] == 0):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def logging_config(*, level: str, fmt: str) -> dict[str, Any]:
    """Settings LOGGING: one console handler (redacting, text or JSON) for every logger."""
    if fmt not in ("text", "json"):
        raise ValueError(f"TENZRO_LOG_FORMAT must be text or json, got {fmt!r}")
    formatter = {"()": "core.logs.JsonFormatter"} if fmt == "json" else {
        "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    routed = {"handlers": ["console"], "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": {"()": "core.logs.RedactSecrets"},
                    "normal_closes": {"()": "core.logs.QuietNormalCloses"}},
        "formatters": {"node": formatter},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "node", "filters": ["redact"]}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "django": {"level": "WARNING"},
            "aioquic": {"level": "WARNING"},
            "qh3": {"level": "WARNING"},
            # Both libraries' connection logger: aioquic says every handshake, ALPN and close at
            # INFO (~6 lines per connection), which are a node's normal traffic; shown at DEBUG.
            "quic": {"filters": ["normal_closes"], "level": "DEBUG" if level.upper() == "DEBUG" else "WARNING"},
            # uvicorn and Celery configure handlers of their own before Django does: route them
            # to ours so their records are redacted and formatted like the rest.
            "uvicorn": {**routed, "level": "INFO"},
            "uvicorn.error": {**routed, "level": "INFO"},
            "uvicorn.access": {**routed, "level": "WARNING"},
            "celery": {**routed, "level": "INFO"},
        },
    }
