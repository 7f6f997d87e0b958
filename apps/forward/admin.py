from django.contrib import admin

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.forward.models import HolderPenalty


@admin.register(HolderPenalty)
class HolderPenaltyAdmin(ReadOnlyAdmin):
    list_display = ("at", "provider_id", "reason", "model_id", "layer", "expert", "rows")
    list_filter = ("reason",)
    search_fields = ("provider_id", "model_id")
