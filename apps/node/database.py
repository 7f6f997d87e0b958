"""The node's database at start: migrated by `python -m django migrate`, unless nothing is pending.

Starting Django just to hear "No migrations to apply" costs a node start 2-3 s of CPU, before any
of its processes may start. For the embedded SQLite file the supervisor can tell without Django:
every migration file of the project's apps has its row in `django_migrations`, and Django (whose
own apps' migrations ship with it) is the version the last migrate ran under, recorded beside the
file. Anything else (a server database through DATABASE_URL, a file it cannot read, a migration
without its row, another Django) runs migrate, as before.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from core.env import BASE_DIR, SQLITE_FILE

# Beside the SQLite file: the Django version its last successful migrate ran under.
MIGRATED_WITH_FILE = "migrated-with"
_LABEL = re.compile(r"""^\s*label\s*=\s*["']([A-Za-z0-9_]+)["']""", re.MULTILINE)


class MigrationError(RuntimeError):
    """`migrate` failed; the message carries its output."""


def project_migrations(root: Path = BASE_DIR / "apps") -> set[tuple[str, str]]:
    """(app label, migration name) of every migration file of the project's apps."""
    found = set()
    for folder in root.glob("*/migrations"):
        config = folder.parent / "apps.py"
        match = _LABEL.search(config.read_text()) if config.exists() else None
        label = match.group(1) if match else folder.parent.name
        found.update((label, path.stem) for path in folder.glob("[0-9]*.py"))
    return found


def sqlite_is_current(data_dir: Path) -> bool:
    """True when the node's SQLite file has every project migration applied under this Django."""
    database = data_dir / SQLITE_FILE
    stamp = data_dir / MIGRATED_WITH_FILE
    if not database.is_file() or not stamp.is_file() or stamp.read_text().strip() != version("django"):
        return False
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
            applied = set(db.execute("SELECT app, name FROM django_migrations").fetchall())
    except sqlite3.Error:
        return False
    return project_migrations() <= applied


def migrate(data_dir: Path, env: dict[str, str]) -> bool:
    """Bring the database up to date; False when nothing was pending (migrate did not run)."""
    embedded = not env.get("DATABASE_URL")
    if embedded and sqlite_is_current(data_dir):
        return False
    done = subprocess.run([sys.executable, "-m", "django", "migrate", "--noinput"], env=env, cwd=BASE_DIR,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise MigrationError(f"{done.stdout}{done.stderr}")
    if embedded:
        (data_dir / MIGRATED_WITH_FILE).write_text(version("django") + "\n")
    return True
