from django.apps import AppConfig


class SettlementConfig(AppConfig):
    name = "apps.settlement"
    label = "settlement"
    verbose_name = "Settlement"
