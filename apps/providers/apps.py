from django.apps import AppConfig


class ProvidersConfig(AppConfig):
    name = "apps.providers"
    label = "providers"
    verbose_name = "Providers (gossip view)"

    def ready(self) -> None:
        # The expert worker serves the gossip methods on its peer door (doors declared there).
        from apps.blobs.peers import blob_holders_lookup
        from apps.providers.handlers import gossip_handlers
        from apps.providers.selectors import blob_holder_endpoints
        from apps.worker.doors import contribute_handlers

        contribute_handlers(gossip_handlers)
        # Blob loads ask the providers that announce a blob, over QUIC pinned to their records.
        blob_holders_lookup(blob_holder_endpoints)
