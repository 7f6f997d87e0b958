"""`assert_no_secrets(text, ...)`: no secret of a node appears in its logs (docs/security.md).

For tests that ran real nodes: pass everything the node printed (NodeProcess.log()) and the
secrets it had. Checks the literal secrets (the operator token, the node key's seed in hex and
base64, Django's secret, whatever else is passed) and the shapes of credentials that should
only ever appear redacted (a Bearer token, an Authorization value, a URL's password).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from pathlib import Path

_REDACTED = "[redacted]"
_SHAPES = {
    "a Bearer token": re.compile(r"(?i)\bbearer\s+(?!\[redacted\])[A-Za-z0-9._~+/=-]{8,}"),
    "an Authorization value": re.compile(
        r"""(?i)authorization['"]?\s*[:=]\s*['"]?(?!\[redacted\]|bearer)[^\s'",}]{8,}"""),
    # Celery's banner masks a broker password as "**" itself
    "a URL password": re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:(?!\[redacted\]@|\*+@)[^@\s/]+@"),
}


def node_secrets(data_dir: Path) -> dict[str, str]:
    """The secrets a node keeps in its data dir, by name (those that exist)."""
    found: dict[str, str] = {}
    key = data_dir / "node.key"
    if key.exists():
        seed = key.read_bytes()
        found.update({"the node key (hex)": seed.hex(), "the node key (base64)": base64.b64encode(seed).decode(),
                      "the node key (urlsafe base64)": base64.urlsafe_b64encode(seed).decode()})
    for name, label in (("operator.token", "the operator token file"), ("django.secret", "Django's secret key")):
        path = data_dir / name
        if path.exists() and path.read_text().strip():
            found[label] = path.read_text().strip()
    return found


def assert_no_secrets(text: str, *, token: str | None = None, key_hex: str | None = None,
                      data_dir: Path | None = None, extra: Iterable[str] = ()) -> None:
    """Raise AssertionError naming each secret (never printing it) found in `text`, with its line number."""
    secrets: dict[str, str] = node_secrets(data_dir) if data_dir is not None else {}
    if token:
        secrets["the operator token"] = token
    if key_hex:
        seed = bytes.fromhex(key_hex)
        secrets.update({"the node key (hex)": key_hex.lower(),
                        "the node key (base64)": base64.b64encode(seed).decode()})
    for i, value in enumerate(extra):
        secrets[f"extra secret #{i}"] = value
    problems: list[str] = []
    lines = text.splitlines()
    for name, value in secrets.items():
        hits = [n for n, line in enumerate(lines, 1) if value and value in line]
        if hits:
            problems.append(f"{name} on line(s) {hits[:10]}")
    for name, shape in _SHAPES.items():
        hits = [n for n, line in enumerate(lines, 1) if shape.search(line)]
        if hits:
            problems.append(f"{name} not redacted on line(s) {hits[:10]}")
    assert not problems, "secrets in the logs: " + "; ".join(problems)
