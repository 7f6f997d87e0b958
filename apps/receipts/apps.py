from django.apps import AppConfig


class ReceiptsConfig(AppConfig):
    name = "apps.receipts"
    label = "receipts"
    verbose_name = "Receipts and disputes"
