from django.apps import AppConfig


class NodeConfig(AppConfig):
    name = "apps.node"
    label = "node"

    def ready(self) -> None:
        # Bind @shared_task to the node's Celery app in every process that sets Django up
        # (web, expert worker), so `.delay()` goes to the node's broker.
        import tenzro_site.celery  # noqa: F401
