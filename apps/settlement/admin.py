"""Settlements in the admin: read-only (only settle_forward writes them, and never changes one)."""

from django.contrib import admin

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.settlement.models import LedgerEntry, PendingSettlement, Settlement


class LedgerEntryInline(admin.TabularInline):
    model = LedgerEntry
    fields = ("account", "kind", "amount", "tokens", "price")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Settlement)
class SettlementAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "forward_id", "model_id", "router_id", "total", "receipts_digest")
    search_fields = ("forward_id", "router_id", "model_id")
    inlines = (LedgerEntryInline,)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("settlement", "account", "kind", "amount", "tokens", "price")
    list_filter = ("kind",)
    search_fields = ("account", "settlement__forward_id")


@admin.register(PendingSettlement)
class PendingSettlementAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "forward_id")
    search_fields = ("forward_id",)
