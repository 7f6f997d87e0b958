"""Writes of the generation records; called from the expert worker's database thread only."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.generation.models import Generation, GenerationState, GenerationStep, LoadedDense
from apps.generation.selectors import generation_to_dict
from apps.generation.signals import generation_batching, generation_progressed


def _sent(row: Generation, steps: list[dict[str, Any]]) -> None:
    # JSON-ready, as the signal promises: the dashboard's channel layer (msgpack) refuses datetimes.
    view = {**generation_to_dict(row, steps=False), "step": steps[-1] if steps else None}
    if steps:
        view["steps"] = steps
    for name in ("created_at", "finished_at"):
        view[name] = view[name].isoformat() if view[name] is not None else None
    transaction.on_commit(lambda: generation_progressed.send(sender=Generation, generation=view))


def generation_start(*, generation_id: str, model_id: str, prompt_ids: list[int], max_new_tokens: int,
                     options: dict[str, Any], running: set[str] = frozenset()) -> Generation:
    """A running generation's record; records beyond the newest TENZRO_GENERATIONS_KEPT are deleted.

    `running`: the generations the worker is running now. Any other record still marked running
    was cut off by a worker stop: it is closed as failed ("interrupted"), its tokens kept."""
    with transaction.atomic():
        generations_interrupted(running=running)
        row = Generation.objects.create(generation_id=generation_id, model_id=model_id, prompt_ids=prompt_ids,
                                        max_new_tokens=max_new_tokens, options=options)
        bound = Generation.objects.values_list("id", flat=True)[settings.TENZRO_GENERATIONS_KEPT:][:1]
        if bound:
            Generation.objects.filter(id__lte=bound[0]).delete()
        _sent(row, [])
    return row


INTERRUPTED = "the expert worker stopped while this generation ran"


def generations_interrupted(*, running: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Close every record still marked running but `running` as failed ("interrupted"), its tokens kept:
    the expert worker that ran it stopped. The worker calls it as it starts. The ones closed,
    {generation_id, stream, tokens}: `stream` the mailbox a client may still be reading (or None)."""
    with transaction.atomic():
        stale = Generation.objects.select_for_update().filter(state=GenerationState.RUNNING).exclude(
            generation_id__in=running)
        closed = [{"generation_id": gid, "stream": options.get("stream"), "tokens": len(tokens)}
                  for gid, options, tokens in stale.values_list("generation_id", "options", "tokens")]
        stale.update(state=GenerationState.FAILED, error_reason="interrupted", finished_at=timezone.now(),
                     finish_reason="error", error_message=INTERRUPTED)
    return closed


def dense_loaded(*, model_id: str, checkpoint: str, dense_bytes: int) -> LoadedDense:
    """Remember that this router holds `model_id`'s dense part from `checkpoint` (loaded again at start)."""
    row, _ = LoadedDense.objects.update_or_create(model_id=model_id,
                                                  defaults={"checkpoint": checkpoint, "dense_bytes": dense_bytes})
    return row


def generation_step(*, generation_id: str, step: dict[str, Any], ttft_ms: float | None = None) -> None:
    """Append one step (its new token under step["token"]); the first step sets the time to first token."""
    generation_steps(generation_id=generation_id, steps=[step], ttft_ms=ttft_ms)


def generation_steps(*, generation_id: str, steps: list[dict[str, Any]], ttft_ms: float | None = None) -> None:
    """Append steps in order, in one transaction and one update of the record (the worker writes a
    generation's steps in batches, off its decode path); `ttft_ms` when the first step is among them."""
    if steps:
        generation_steps_many(batches=[(generation_id, steps, ttft_ms)])


def generation_steps_many(*, batches: list[tuple[str, list[dict[str, Any]], float | None]]) -> None:
    """generation_steps of several generations, (generation_id, steps, ttft_ms) each in the order given,
    in one transaction: concurrent generations' steps cost one commit per flush, not one each."""
    if not batches:
        return
    with transaction.atomic():
        rows = Generation.objects.select_for_update().in_bulk([gid for gid, _, _ in batches],
                                                              field_name="generation_id")
        GenerationStep.objects.bulk_create([GenerationStep(generation=rows[gid], index=s["index"], data=s)
                                            for gid, steps, _ in batches if gid in rows for s in steps])
        changed: set[str] = set()
        for gid, steps, ttft_ms in batches:
            row = rows.get(gid)
            if row is None:  # deleted past TENZRO_GENERATIONS_KEPT while it ran: nothing to append to
                continue
            row.tokens = [*row.tokens, *(s["token"] for s in steps)]
            row.text += "".join(s.get("text", "") for s in steps)  # what could be shown so far (the end adds the rest)
            if ttft_ms is not None:
                row.ttft_ms = ttft_ms
            changed.add(gid)
            _sent(row, steps)  # the view as of this batch: a page still sees the steps arrive as they were handed over
        Generation.objects.bulk_update([rows[gid] for gid in changed], ["tokens", "text", "ttft_ms"])


def generation_finish(*, generation_id: str, decode_tokens_per_s: float | None = None, error_reason: str = "",
                      error_message: str = "", finish_reason: str = "", text: str = "") -> None:
    """Done, cancelled (finish_reason "cancelled"), or failed with a reason when error_reason is given; the
    tokens and text so far are kept either way."""
    with transaction.atomic():
        row = Generation.objects.select_for_update().get(generation_id=generation_id)
        row.state = GenerationState.FAILED if error_reason else \
            GenerationState.CANCELLED if finish_reason == "cancelled" else GenerationState.DONE
        row.decode_tokens_per_s = decode_tokens_per_s
        row.error_reason, row.error_message = error_reason, error_message[:2000]
        row.finish_reason = finish_reason or ("error" if error_reason else "")
        row.text = text
        row.finished_at = timezone.now()
        row.save(update_fields=["state", "decode_tokens_per_s", "error_reason", "error_message", "finish_reason",
                                "text", "finished_at"])
        _sent(row, [])


def generation_batching_publish(*, batching: dict[str, Any]) -> None:
    """The router's continuous batching as it is now (WholeModelHandlers.batching_view) to whoever listens
    (the dashboards' live view). Nothing is written: it is a snapshot of the worker's memory."""
    generation_batching.send(sender=Generation, batching=batching)
