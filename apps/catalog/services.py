"""Prepare jobs: create, run (the Celery task's body), resume after a worker restart.

A job is idempotent: slicing and quantization are deterministic, so running it again (after a
crash, or as a new job with the same arguments) publishes byte-identical blobs and hashes.
Progress is saved after every expert, and a re-run skips experts whose blobs are stored.

A job either slices an MoE layer's experts by id, or (``dense_slices`` N) cuts a dense layer
into N d_ff slices published as experts 0 … N-1 under a dense gate (apps/catalog/dense.py).
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.blobs.selectors import blob_store
from apps.catalog.checkpoint import CheckpointError, CheckpointReader
from apps.catalog.dense import dense_gate_payload, dense_layer, prepare_dense_slice
from apps.catalog.models import JobState, KnownShape, PrepareJob
from apps.catalog.selectors import default_checkpoint, prepare_job_to_dict
from apps.catalog.shapes import CatalogError, ModelShape, catalog_shape, shape_from_config, shape_to_dict
from apps.catalog.signals import prepare_progressed
from apps.catalog.slicing import SlicingError, gate_payload_for_layer, prepare_expert
from apps.node.selectors import redis_client
from core.errors import InvalidInput
from core.formats.expert_payload import PayloadError
from core.formats.gate_payload import MAX_DENSE_SLICES
from core.quantization.presets import resolve_quant

logger = logging.getLogger(__name__)
LOCK_KEY = "tenzro:prepare-lock:{job_id}"
PREPARE_TASK = "tenzro.catalog.prepare"  # the name apps/catalog/tasks.py registers


class JobBusy(Exception):
    """Another worker process holds the job's lock; the task retries later."""


def prepare_job_create(
    *, model_id: str, layer: int, experts: list[int] | None, quant: str | Mapping[str, str] | None,
    checkpoint: str | None, dense_slices: int | None = None,
) -> PrepareJob:
    """Validate and queue a prepare job (the task is sent after the row commits).

    With `dense_slices` N the layer must be dense (checked when the job reads the checkpoint)
    and `experts` names the slice ids to publish, default all of 0 … N-1; the dense gate is
    always published."""
    try:
        resolve_quant(quant)
    except ValueError as exc:
        raise InvalidInput(f"invalid quant: {exc}", reason="invalid_quant") from exc
    if dense_slices is not None:
        if isinstance(dense_slices, bool) or not 1 <= dense_slices <= MAX_DENSE_SLICES:
            raise InvalidInput(f"dense_slices must be in 1..{MAX_DENSE_SLICES}, got {dense_slices!r}",
                               reason="dense_slices_out_of_range")
        if experts is None:
            experts = list(range(dense_slices))
        outside = sorted({e for e in experts if not 0 <= e < dense_slices})
        if outside:
            raise InvalidInput(f"a layer cut into {dense_slices} dense slices has slice ids 0..{dense_slices - 1}; "
                               f"asked for {outside}", reason="expert_out_of_range")
    wanted = sorted(set(experts or ()))
    if not wanted or wanted[0] < 0:
        raise InvalidInput(f"experts must be non-empty, non-negative ids, got {experts}")
    source = checkpoint or default_checkpoint(model_id)
    if source is None:
        raise InvalidInput(f"no checkpoint given and the catalog has no default source for {model_id!r}",
                           reason="checkpoint_required")
    job = PrepareJob.objects.create(model_id=model_id, layer=layer, experts=wanted, quant=quant, checkpoint=source,
                                    dense_slices=dense_slices)
    transaction.on_commit(lambda: _enqueue(str(job.pk)))
    _push_progress(job, force=True)
    return job


def _enqueue(job_id: str) -> None:
    # By the task's registered name: tasks.py imports this module, so importing it back
    # would make a cycle.
    current_app.send_task(PREPARE_TASK, args=[job_id])


def _shape(model_id: str, config: dict[str, Any]) -> ModelShape:
    """The checkpoint's own config is authoritative; the catalog entry is the fallback."""
    try:
        return shape_from_config(model_id, config)
    except CatalogError:
        return catalog_shape(model_id)


def known_shape_remember(shape: ModelShape, *, source: str) -> None:
    """Keep a shape read from a checkpoint, so the shard map can list the experts nobody holds."""
    KnownShape.objects.update_or_create(model_id=shape.model_id,
                                        defaults={"shape": shape_to_dict(shape), "source": source})


def _dense_shape(model_id: str, config: dict[str, Any]) -> ModelShape | None:
    """As `_shape`, but a model with no MoE shape at all (a Llama) is fine: its tensors decide."""
    try:
        return _shape(model_id, config)
    except CatalogError:
        return None


def prepare_job_run(*, job_id: str) -> None:
    """Run a job to completion unless it is finished or another worker holds it (JobBusy)."""
    lock = redis_client().lock(LOCK_KEY.format(job_id=job_id), timeout=settings.TENZRO_PREPARE_LOCK_TTL_S)
    # The token names this host: a worker starting here may clear it (prepare_jobs_resume).
    if not lock.acquire(blocking=False, token=f"{socket.gethostname()}/{uuid.uuid4().hex}"):
        raise JobBusy(job_id)
    try:
        job = PrepareJob.objects.get(pk=job_id)
        if job.state in (JobState.DONE, JobState.FAILED):
            return
        job.state, job.started_at, job.attempts = JobState.RUNNING, timezone.now(), job.attempts + 1
        job.save(update_fields=["state", "started_at", "attempts"])
        _push_progress(job, force=True)
        try:
            _run(job, lock)
        except (CheckpointError, SlicingError, CatalogError, PayloadError, ValueError) as exc:
            job.state, job.error_reason, job.error = JobState.FAILED, getattr(exc, "reason", "invalid_input"), str(exc)
            logger.warning("prepare job %s failed: %s", job_id, exc)
        else:
            job.state = JobState.DONE
        job.finished_at = timezone.now()
        job.save(update_fields=["state", "error_reason", "error", "finished_at"])
        _push_progress(job, force=True)
    finally:
        try:
            lock.release()
        except Exception:  # expired while we worked: nothing to release
            logger.debug("prepare lock of %s had expired", job_id)


def _run(job: PrepareJob, lock: Any) -> None:
    store = blob_store()
    results = job.results or {}
    results.setdefault("experts", {})
    with CheckpointReader.open(job.checkpoint) as reader:
        if job.dense_slices:
            _run_dense(job, lock, reader, store, results)
            return
        shape = _shape(job.model_id, reader.config)
        known_shape_remember(shape, source=job.checkpoint)
        total = shape.n_experts_total
        outside = [e for e in job.experts if total is not None and e >= total]
        if outside:  # checked before anything is published, so a refused job stores nothing
            raise SlicingError("expert_out_of_range", f"{job.model_id} has experts 0..{total - 1} "
                               f"(routed, then shared); asked for {outside}")
        _publish(job, lock, store, results,
                 gate=lambda: gate_payload_for_layer(reader, shape, job.layer, model_id=job.model_id),
                 piece=lambda expert: prepare_expert(reader, shape, model_id=job.model_id, layer=job.layer,
                                                     expert=expert, quant=job.quant))


def _run_dense(job: PrepareJob, lock: Any, reader: CheckpointReader, store: Any, results: dict[str, Any]) -> None:
    """A dense layer: its layout checked before anything is published, then the gate, then each slice."""
    dense = dense_layer(reader, _dense_shape(job.model_id, reader.config), job.layer, n_slices=job.dense_slices,
                        quant=job.quant)
    results["dense"] = {"d_model": dense.d_model, "d_ff": dense.d_ff, "slice_align": dense.slice_align,
                        "bounds": [list(b) for b in dense.bounds]}
    _publish(job, lock, store, results, gate=lambda: dense_gate_payload(dense, model_id=job.model_id),
             piece=lambda slice_id: prepare_dense_slice(reader, dense, model_id=job.model_id, slice_id=slice_id,
                                                        quant=job.quant))


def _publish(job: PrepareJob, lock: Any, store: Any, results: dict[str, Any], *, gate: Callable[[], bytes],
             piece: Callable[[int], tuple[bytes, dict[str, str]]]) -> None:
    """Store the gate, then each of job.experts (an expert or a dense slice), saving progress after
    each; what a restarted job already stored is skipped (its bytes would be identical anyway)."""
    done = results["experts"]
    if not (results.get("gate") and store.has(results["gate"]["hash"])):
        payload = gate()
        results["gate"] = {"hash": store.put(payload), "size": len(payload)}
        _save_progress(job, results, lock)
    for expert in job.experts:
        entry = done.get(str(expert))
        if entry and store.has(entry["hash"]):
            continue
        payload, formats = piece(expert)
        done[str(expert)] = {"hash": store.put(payload), "size": len(payload), "formats": formats}
        _save_progress(job, results, lock)


def _save_progress(job: PrepareJob, results: dict[str, Any], lock: Any) -> None:
    job.results = results
    job.save(update_fields=["results"])
    lock.extend(settings.TENZRO_PREPARE_LOCK_TTL_S, replace_ttl=True)
    _push_progress(job)


def _push_progress(job: PrepareJob, *, force: bool = False) -> None:
    """Send prepare_progressed once the write commits: always for a state change (`force`), else
    at most once per TENZRO_PREPARE_PUSH_INTERVAL_S per job (the instance remembers when it last
    sent; one worker runs a job, so one instance sees all of its progress writes). The last
    progress before `done` may be coalesced away; the `done` push carries everything."""
    now = time.monotonic()
    if not force and now - getattr(job, "_pushed_at", float("-inf")) < settings.TENZRO_PREPARE_PUSH_INTERVAL_S:
        return
    job._pushed_at = now
    payload = prepare_job_to_dict(job)
    transaction.on_commit(lambda: prepare_progressed.send(sender=PrepareJob, job=payload))


def prepare_jobs_resume() -> list[str]:
    """Requeue every unfinished job; called when a Celery worker of this node starts.

    A job left `running` by a killed worker would otherwise wait for the broker's visibility
    timeout (an hour). A worker starting on a host runs none of this node's jobs yet, so the
    locks held from this host are stale and cleared before requeueing. Locks held from another
    host (a prepare worker there, docs/operations.md "Running a network across machines") are
    left alone: their job is requeued anyway, and its run waits (JobBusy, retried) until that
    worker finishes it or its lock expires (TENZRO_PREPARE_LOCK_TTL_S).
    """
    ids = [str(pk) for pk in PrepareJob.objects.filter(state__in=[JobState.QUEUED, JobState.RUNNING])
           .values_list("pk", flat=True)]
    client = redis_client()
    here = socket.gethostname()
    for job_id in ids:
        owner = client.get(LOCK_KEY.format(job_id=job_id))
        if isinstance(owner, bytes):
            owner = owner.decode(errors="replace")
        if owner is not None and owner.split("/", 1)[0] == here:
            client.delete(LOCK_KEY.format(job_id=job_id))
        _enqueue(job_id)
    if ids:
        logger.info("requeued %d unfinished prepare jobs", len(ids))
    return ids
