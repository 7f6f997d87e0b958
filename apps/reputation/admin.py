"""Reputation in the admin: read-only (only forwards, disputes and settlements move a score)."""

from django.contrib import admin

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.reputation.models import Reputation, ReputationEvent


@admin.register(Reputation)
class ReputationAdmin(ReadOnlyAdmin):
    list_display = ("provider_id", "score", "credits_total", "penalties_total", "credit_count", "penalty_count",
                    "updated_at")
    search_fields = ("provider_id",)


@admin.register(ReputationEvent)
class ReputationEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "provider_id", "kind", "amount", "reason", "ref")
    list_filter = ("kind",)
    search_fields = ("provider_id", "ref")
