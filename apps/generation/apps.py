from django.apps import AppConfig


class GenerationConfig(AppConfig):
    name = "apps.generation"
    label = "generation"
    verbose_name = "Whole-model generation"
