"""The gossip view in the admin: read-only (only gossip and this node's own record write it)."""

from django.contrib import admin

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.providers.models import GossipCount, Holding, Provider, Reachability


@admin.register(Provider)
class ProviderAdmin(ReadOnlyAdmin):
    list_display = ("name", "provider_id", "is_self", "seq", "roles", "http_endpoint", "quic_endpoint", "moe_gpu",
                    "latency_ms", "wire_ns_per_byte", "changed_at")
    list_filter = ("is_self", "moe_gpu")
    search_fields = ("provider_id", "name")
    exclude = ("record_text",)


@admin.register(Holding)
class HoldingAdmin(ReadOnlyAdmin):
    list_display = ("model_id", "layer", "expert", "residency", "committed_tps", "provider")
    list_filter = ("residency", "model_id")


@admin.register(GossipCount)
class GossipCountAdmin(ReadOnlyAdmin):
    list_display = ("verdict", "count")


@admin.register(Reachability)
class ReachabilityAdmin(ReadOnlyAdmin):
    list_display = ("http_ok", "quic_ok", "checked_by", "checked_at", "detail")
