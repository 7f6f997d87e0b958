from django.contrib import admin

from apps.receipts.models import Dispute, Receipt


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:  # written by forwards and disputes, never by hand
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Receipt)
class ReceiptAdmin(ReadOnly):
    list_display = ("created_at", "model_id", "layer", "expert", "provider_id", "tokens", "commitment_hash")
    search_fields = ("commitment_hash", "provider_id", "model_id")
    exclude = ("carrier", "sketch")


@admin.register(Dispute)
class DisputeAdmin(ReadOnly):
    list_display = ("opened_at", "receipt", "state", "difference", "tolerance", "penalty", "decided_at")
    list_filter = ("state",)
