from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "apps.catalog"
    label = "catalog"
    verbose_name = "Model catalog and prepare jobs"

    def ready(self) -> None:
        # Blob garbage collection keeps every blob a prepare job published.
        from apps.blobs.references import blob_reference_source
        from apps.catalog.selectors import referenced_blob_hashes

        blob_reference_source(referenced_blob_hashes)
