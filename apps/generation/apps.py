from django.apps import AppConfig


class GenerationConfig(AppConfig):
    name = "apps.generation"
    label = "generation"
    verbose_name = "Whole-model generation"

    def ready(self) -> None:
        # The expert worker serves moe/load_dense, moe/model_forward and moe/generate (their doors
        # are declared in apps/worker/doors.py); they drive apps.forward's distributed forward.
        from apps.generation.handlers import generation_handlers
        from apps.worker.doors import contribute_handlers

        contribute_handlers(generation_handlers)
