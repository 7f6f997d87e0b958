from django.apps import AppConfig


class ReputationConfig(AppConfig):
    name = "apps.reputation"
    label = "reputation"
    verbose_name = "Provider reputation"
