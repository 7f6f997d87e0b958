"""The expert worker's published state, read-only: the worker writes these rows itself on every
change of what it holds (apps/worker/services.py); loading and unloading go through the operator
door (`tenzro moe load-expert`, `tenzro_moeUnloadExpert`), never through a hand edit here."""

from django.contrib import admin

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.worker.models import HeldExpert, HeldGate, WorkerState


@admin.register(WorkerState)
class WorkerStateAdmin(ReadOnlyAdmin):
    list_display = ("pid", "provider_id", "backend", "cpu_kernel", "memory_used_bytes", "memory_budget_bytes",
                    "committed_tps", "capacity_tps", "heartbeat_at", "stopped_at")


@admin.register(HeldExpert)
class HeldExpertAdmin(ReadOnlyAdmin):
    list_display = ("model_id", "layer", "expert", "residency", "memory_bytes", "disk_bytes", "d_model", "d_ff",
                    "blob_uri", "changed_at")
    list_filter = ("residency", "model_id")
    search_fields = ("model_id", "blob_uri")


@admin.register(HeldGate)
class HeldGateAdmin(ReadOnlyAdmin):
    list_display = ("model_id", "layer", "router", "n_routed", "n_shared_experts", "top_k", "d_model",
                    "memory_bytes", "blob_uri", "changed_at")
    list_filter = ("model_id",)
