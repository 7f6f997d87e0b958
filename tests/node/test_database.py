"""A node start migrates only when something is pending (apps/node/database.py): the real
`django migrate` on a real SQLite file, and the check that lets a start skip it."""

from __future__ import annotations

import os
import sqlite3

from apps.node.database import MIGRATED_WITH_FILE, migrate, project_migrations, sqlite_is_current
from core.env import SQLITE_FILE


def test_migrate_runs_only_when_a_migration_is_pending(tmp_path) -> None:
    env = {**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, "TENZRO_DATA_DIR": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "tenzro_site.settings.base"}
    assert not sqlite_is_current(tmp_path)  # no database yet
    assert migrate(tmp_path, env) is True and sqlite_is_current(tmp_path)
    assert migrate(tmp_path, env) is False  # nothing pending: no Django started

    # A migration file whose row is missing (a node updated to new code) is pending: migrate runs.
    assert ("worker", "0004_alter_workerstate_options") in project_migrations()
    with sqlite3.connect(tmp_path / SQLITE_FILE) as db:  # an options-only migration: safe to apply again
        db.execute("DELETE FROM django_migrations WHERE app = 'worker' AND name = '0004_alter_workerstate_options'")
    assert not sqlite_is_current(tmp_path)
    assert migrate(tmp_path, env) is True and sqlite_is_current(tmp_path)

    # Another Django (its own apps' migrations ship with it): migrate runs.
    (tmp_path / MIGRATED_WITH_FILE).write_text("4.2.0\n")
    assert not sqlite_is_current(tmp_path)
    assert migrate(tmp_path, env) is True and sqlite_is_current(tmp_path)
    # A database named by DATABASE_URL (a server's, usually) is never judged here: migrate runs.
    assert migrate(tmp_path, {**env, "DATABASE_URL": f"sqlite:///{tmp_path / SQLITE_FILE}"}) is True


def test_a_file_that_is_not_a_database_is_not_current(tmp_path) -> None:
    (tmp_path / SQLITE_FILE).write_bytes(b"not sqlite")
    (tmp_path / MIGRATED_WITH_FILE).write_text("5.2.19\n")
    assert not sqlite_is_current(tmp_path)
