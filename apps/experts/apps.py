from django.apps import AppConfig


class ExpertsConfig(AppConfig):
    name = "apps.experts"
    label = "experts"
    verbose_name = "Expert-host runtime"
