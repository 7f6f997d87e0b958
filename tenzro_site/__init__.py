"""The roof of the house: the Django project (settings, urls, asgi) and the Celery app.

It only imports: no app imports anything from here. The Celery app is loaded with the
project (as Celery's Django guide does), so `@shared_task` binds to the node's broker in
every process that sets Django up (web, expert worker, Celery) and `celery -A tenzro_site`
finds it. Settings helpers live in core/env.py and core/logs.py (docs/architecture.md).
"""

from tenzro_site.celery import app as celery_app

__all__ = ["celery_app"]
