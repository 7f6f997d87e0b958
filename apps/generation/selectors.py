"""Reads of the generations this router ran."""

from __future__ import annotations

from typing import Any

from apps.generation.models import Generation, GenerationState, LoadedDense
from core.errors import NotFound


def generation_to_dict(row: Generation, *, steps: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "generation_id": row.generation_id, "model_id": row.model_id, "state": row.state,
        "prompt_ids": row.prompt_ids, "max_new_tokens": row.max_new_tokens, "options": row.options,
        "tokens": row.tokens, "text": row.text, "finish_reason": row.finish_reason or None,
        "ttft_ms": row.ttft_ms, "decode_tokens_per_s": row.decode_tokens_per_s,
        "error": {"reason": row.error_reason, "message": row.error_message} if row.error_reason else None,
        "created_at": row.created_at, "finished_at": row.finished_at,
    }
    if steps:
        out["steps"] = [data for data in row.step_rows.order_by("index").values_list("data", flat=True)]
    return out


def generation_get(*, generation_id: str, steps: bool = True) -> dict[str, Any]:
    row = Generation.objects.filter(generation_id=generation_id).first()
    if row is None:
        raise NotFound(f"no generation {generation_id!r} on this node", reason="unknown_generation")
    return generation_to_dict(row, steps=steps)


def generation_running(*, generation_id: str) -> bool:
    """Whether it is still running (one indexed read of one column: what a waiting client polls)."""
    return Generation.objects.filter(generation_id=generation_id, state=GenerationState.RUNNING).exists()


def generations_recent(*, limit: int = 20) -> list[dict[str, Any]]:
    return [generation_to_dict(row, steps=False) for row in Generation.objects.all()[:limit]]


def generation_models(*, limit: int = 200) -> list[str]:
    """The models of the most recent generations, newest first, once each."""
    ids = Generation.objects.values_list("model_id", flat=True)[:limit]
    return list(dict.fromkeys(ids))


def dense_loaded_list() -> list[dict[str, Any]]:
    """The dense parts this router loaded, {model_id, checkpoint, dense_bytes}, oldest model id first."""
    return list(LoadedDense.objects.values("model_id", "checkpoint", "dense_bytes"))
