"""The node's Celery application (broker and result backend: the node's Redis database)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tenzro_site.settings.base")

app = Celery("tenzro_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
