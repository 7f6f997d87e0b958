"""The admin of a record the node writes itself (gossip, forwards, receipts, settlements,
reputation): shown, searched and filtered, never added, edited or deleted by hand, since a
hand edit would break what those rows prove (a signature, a ledger that sums, a dispute)."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
