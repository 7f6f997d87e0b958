from django.apps import AppConfig


class BlobsConfig(AppConfig):
    name = "apps.blobs"
    label = "blobs"
    verbose_name = "Blob store"
