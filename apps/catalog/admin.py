"""Prepare jobs in the admin: read-only (jobs are created by `tenzro moe prepare-experts`)."""

from django.contrib import admin
from django.http import HttpRequest

from apps.catalog.models import PrepareJob


@admin.register(PrepareJob)
class PrepareJobAdmin(admin.ModelAdmin):
    list_display = ("id", "model_id", "layer", "state", "error_reason", "attempts", "created_at", "finished_at")
    list_filter = ("state", "model_id")
    search_fields = ("model_id", "id")
    readonly_fields = tuple(f.name for f in PrepareJob._meta.fields)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: PrepareJob | None = None) -> bool:
        return False
