from django.apps import AppConfig


class NodeConfig(AppConfig):
    name = "apps.node"
    label = "node"
