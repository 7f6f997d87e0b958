"""The beat process's Celery app (tenzro_site/beat.py) carries the node's schedule and broker
without setting Django up: it only sends tasks by name, so it must not pay for every app's import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import tenzro_site.beat as beat
from tenzro_site.settings import base
app = beat.app
print(json.dumps({
    "django_apps_loaded": "django.apps.registry" in sys.modules and sys.modules["django.apps"].apps.ready,
    "app_modules": sorted(m for m in sys.modules if m.startswith("apps.")),
    "fixups": list(app.fixups),
    "broker": app.conf.broker_url,
    "schedule": {k: [v["task"], float(v["schedule"])] for k, v in app.conf.beat_schedule.items()},
    "want": {k: [v["task"], float(v["schedule"])] for k, v in base.CELERY_BEAT_SCHEDULE.items()},
    "hijack": app.conf.worker_hijack_root_logger,
}))
"""


def test_the_beat_app_has_the_schedule_and_broker_and_no_django(tmp_path) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tenzro_site.settings.base", "TENZRO_DATA_DIR": str(tmp_path),
           "REDIS_URL": "redis://127.0.0.1:6379/7", "TENZRO_GOSSIP_INTERVAL_S": "2.5"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["django_apps_loaded"] is False and seen["app_modules"] == [] and seen["fixups"] == []
    assert seen["broker"] == "redis://127.0.0.1:6379/7"
    assert seen["schedule"] == seen["want"] and seen["schedule"]["gossip-round"] == ["tenzro.providers.gossip_round",
                                                                                     2.5]
    assert seen["hijack"] is False  # the settings' LOGGING handler stays (redacted records)
