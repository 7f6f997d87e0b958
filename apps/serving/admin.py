from django.contrib import admin

from apps.serving import services
from apps.serving.models import ClientKey


@admin.register(ClientKey)
class ClientKeyAdmin(admin.ModelAdmin):
    """Keys are made with `tenzro keys create` (the secret is shown once); here they are seen and revoked."""

    list_display = ("prefix", "name", "requests_per_minute", "requests", "prompt_tokens", "completion_tokens",
                    "last_used_at", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "name")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at", "requests", "prompt_tokens",
                       "completion_tokens")
    fields = ("name", "prefix", "requests_per_minute", "revoked_at", *readonly_fields[1:])

    def has_add_permission(self, request) -> bool:  # a key made here could never be shown: use the CLI or RPC
        return False

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        services.keys_changed()  # a revocation or a new limit holds at the key's next request

    def delete_model(self, request, obj) -> None:
        super().delete_model(request, obj)
        services.keys_changed()

    def delete_queryset(self, request, queryset) -> None:
        super().delete_queryset(request, queryset)
        services.keys_changed()
