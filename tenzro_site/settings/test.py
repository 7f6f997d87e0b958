"""Test settings: a throwaway data dir, Redis database 15 for the in-process tests.

Multi-process tests (tests/e2e) start real nodes that read their own environment.
"""

import os
import tempfile

os.environ.setdefault("TENZRO_DATA_DIR", tempfile.mkdtemp(prefix="tenzro-test-"))
os.environ.setdefault("REDIS_URL", os.environ.get("TENZRO_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
os.environ.setdefault("TENZRO_OPERATOR_TOKEN", "test-operator-token")

from tenzro_site.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = False

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    # A file, not Django's shared-cache in-memory default: there, two threads writing at once fail
    # at once with "database table is locked" instead of waiting their turn as the node's own
    # processes do on its SQLite file (busy timeout, WAL), so the concurrency tests
    # (tests/settlement, tests/reputation) could not run two writers.
    DATABASES["default"]["TEST"] = {"NAME": os.path.join(os.environ["TENZRO_DATA_DIR"], "test.sqlite3")}  # noqa: F405
