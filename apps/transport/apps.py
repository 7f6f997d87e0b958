from django.apps import AppConfig


class TransportConfig(AppConfig):
    name = "apps.transport"
    label = "transport"
