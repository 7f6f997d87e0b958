from django.contrib import admin

from apps.forward.models import HolderPenalty


@admin.register(HolderPenalty)
class HolderPenaltyAdmin(admin.ModelAdmin):
    list_display = ("at", "provider_id", "reason", "model_id", "layer", "expert", "rows")
    list_filter = ("reason",)
    search_fields = ("provider_id", "model_id")

    def has_add_permission(self, request) -> bool:  # written by forwards, never by hand
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
