from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "apps.worker"
    label = "worker"
    verbose_name = "Expert worker"

    def ready(self) -> None:
        # Blob garbage collection keeps every blob a published holding names.
        from apps.blobs.references import blob_reference_source
        from apps.worker.selectors import held_blob_hashes

        blob_reference_source(held_blob_hashes)
