"""The node's Celery beat application: the schedule and the broker, without Django.

Beat never runs a task: it sends each entry of CELERY_BEAT_SCHEDULE by its registered name when it
is due. The full application (tenzro_site/celery.py) sets Django up and imports every app's tasks,
~1.7 s of CPU on each node start spent in a process that uses none of it; this one reads the same
CELERY_* values and LOGGING from the settings module as plain Python, with Celery's Django fix-up
off (docs/operations.md, "Processes").
"""

from __future__ import annotations

import importlib
import logging.config
import os

from celery import Celery

settings = importlib.import_module(os.environ.get("DJANGO_SETTINGS_MODULE", "tenzro_site.settings.base"))
logging.config.dictConfig(settings.LOGGING)

app = Celery("tenzro_site", fixups=[])
app.config_from_object(settings, namespace="CELERY")
