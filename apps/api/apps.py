from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class ApiConfig(AppConfig):
    name = "apps.api"
    label = "tenzro_api"

    def ready(self) -> None:
        # Every app declares its JSON-RPC/REST methods in its own api.py.
        autodiscover_modules("api")
