"""`make superuser` without a terminal: it takes DJANGO_SUPERUSER_* instead of hanging or
silently doing nothing, and says what to set when they are missing."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], data_dir: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_SUPERUSER_", "DATABASE_URL"))}
    return subprocess.run(argv, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                          env={**clean, "TENZRO_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE":
                               "tenzro_site.settings.base", **env})


def test_make_superuser_without_a_terminal(tmp_path: Path) -> None:
    refused = _run(["make", "-s", "superuser"], tmp_path)
    assert refused.returncode != 0 and "DJANGO_SUPERUSER_USERNAME" in refused.stderr, refused
    assert _run([sys.executable, "manage.py", "migrate", "-v0"], tmp_path).returncode == 0
    made = _run(["make", "-s", "superuser"], tmp_path, DJANGO_SUPERUSER_USERNAME="ops",
                DJANGO_SUPERUSER_PASSWORD="a-long-password", DJANGO_SUPERUSER_EMAIL="ops@example.com")
    assert made.returncode == 0, made.stderr
    with sqlite3.connect(tmp_path / "node.sqlite3") as db:
        assert db.execute("SELECT username, email, is_superuser FROM auth_user").fetchall() == [
            ("ops", "ops@example.com", 1)]
