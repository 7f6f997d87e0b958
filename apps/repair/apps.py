from django.apps import AppConfig


class RepairConfig(AppConfig):
    name = "apps.repair"
    label = "repair"
    verbose_name = "Repair"
