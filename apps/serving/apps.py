from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "apps.serving"
    label = "serving"
    verbose_name = "Serving (OpenAI-compatible API and client keys)"
