from django.apps import AppConfig


class ForwardConfig(AppConfig):
    name = "apps.forward"
    label = "forward"
    verbose_name = "Distributed forward"

    def ready(self) -> None:
        # The expert worker serves moe/forward (its door is declared in apps/worker/doors.py).
        from apps.forward.handlers import forward_handlers
        from apps.worker.doors import contribute_handlers

        contribute_handlers(forward_handlers)
