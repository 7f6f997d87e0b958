"""Reputation in the admin: read-only (only forwards, disputes and settlements move a score)."""

from django.contrib import admin

from apps.reputation.models import Reputation, ReputationEvent


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Reputation)
class ReputationAdmin(ReadOnly):
    list_display = ("provider_id", "score", "credits_total", "penalties_total", "credit_count", "penalty_count",
                    "updated_at")
    search_fields = ("provider_id",)


@admin.register(ReputationEvent)
class ReputationEventAdmin(ReadOnly):
    list_display = ("at", "provider_id", "kind", "amount", "reason", "ref")
    list_filter = ("kind",)
    search_fields = ("provider_id", "ref")
