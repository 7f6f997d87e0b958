from django.contrib import admin

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.generation.models import Generation, LoadedDense


@admin.register(Generation)
class GenerationAdmin(ReadOnlyAdmin):
    list_display = ("generation_id", "model_id", "state", "max_new_tokens", "ttft_ms", "decode_tokens_per_s",
                    "created_at", "finished_at")
    list_filter = ("state", "model_id")
    search_fields = ("generation_id", "model_id")


@admin.register(LoadedDense)
class LoadedDenseAdmin(ReadOnlyAdmin):
    list_display = ("model_id", "checkpoint", "dense_bytes", "loaded_at")
    search_fields = ("model_id", "checkpoint")
