from django.contrib import admin

from apps.generation.models import Generation
from apps.read_only_admin import ReadOnlyAdmin


@admin.register(Generation)
class GenerationAdmin(ReadOnlyAdmin):
    list_display = ("generation_id", "model_id", "state", "max_new_tokens", "ttft_ms", "decode_tokens_per_s",
                    "created_at", "finished_at")
    list_filter = ("state", "model_id")
    search_fields = ("generation_id", "model_id")
