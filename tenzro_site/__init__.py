"""Django project package of the Tenzro MoE node.

The Celery app is imported by apps.node's AppConfig.ready() rather than here, so that the
plain modules under tenzro_site.settings.env stay importable without Django.
"""
