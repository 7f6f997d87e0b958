from django.contrib import admin

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.receipts.models import Dispute, Receipt


@admin.register(Receipt)
class ReceiptAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "model_id", "layer", "expert", "provider_id", "tokens", "commitment_hash")
    search_fields = ("commitment_hash", "provider_id", "model_id")
    exclude = ("carrier", "sketch")


@admin.register(Dispute)
class DisputeAdmin(ReadOnlyAdmin):
    list_display = ("opened_at", "receipt", "state", "difference", "tolerance", "penalty", "decided_at")
    list_filter = ("state",)
