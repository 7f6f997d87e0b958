from django.contrib import admin

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.repair.models import RepairPass


@admin.register(RepairPass)
class RepairPassAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "trigger", "model_ids", "considered", "fetched", "dropped", "unrepairable_count",
                    "duration_ms", "error")
    list_filter = ("trigger",)
