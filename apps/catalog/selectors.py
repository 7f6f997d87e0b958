"""Reads of the catalog and of prepare jobs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from apps.blobs.store import blob_uri
from apps.catalog.checkpoint import CheckpointError, CheckpointReader
from apps.catalog.models import JobState, KnownShape, PrepareJob
from apps.catalog.shapes import CatalogError, ModelShape, catalog_shape, shape_from_config, shape_to_dict
from core.errors import InvalidInput, NotFound

HUB_URL = "https://huggingface.co/{repo}/resolve/main"


def default_checkpoint(model_id: str) -> str | None:
    """The catalog's default checkpoint URL for a model, if it has one."""
    try:
        repo = catalog_shape(model_id).default_source
    except CatalogError:
        return None
    return HUB_URL.format(repo=repo) if repo else None


def model_shape(*, model_id: str, checkpoint: str | None = None) -> ModelShape:
    """The catalog entry; for a model not in the catalog, the shape read from `checkpoint`'s config.json."""
    try:
        return catalog_shape(model_id)
    except CatalogError as exc:
        if checkpoint is None:
            raise NotFound(str(exc), reason=exc.reason) from exc
    try:
        with CheckpointReader.open(checkpoint) as reader:
            return shape_from_config(model_id, reader.config)
    except (CheckpointError, CatalogError) as exc:
        raise InvalidInput(str(exc), reason=exc.reason) from exc


def model_shape_dict(*, model_id: str, checkpoint: str | None = None) -> dict[str, Any]:
    return shape_to_dict(model_shape(model_id=model_id, checkpoint=checkpoint))


def in_catalog(model_id: str) -> bool:
    try:
        catalog_shape(model_id)
    except CatalogError:
        return False
    return True


def expected_experts(model_id: str) -> list[tuple[int, int]] | None:
    """Every (layer, expert) the model has, routed and shared, when its shape is known: the built-in
    catalog, else a checkpoint's config a prepare job or catalog-shape read here (KnownShape). None when
    the shape, its MoE layer layout or its expert count is unknown."""
    known = KnownShape.objects.filter(model_id=model_id).values_list("shape", flat=True).first()
    if known is not None:
        layers, total = known.get("moe_layers"), known.get("n_experts_total")
    else:
        try:
            shape = catalog_shape(model_id)
        except CatalogError:
            return None
        layers, total = shape.moe_layers, shape.n_experts_total
    if layers is None or total is None:
        return None
    return [(layer, expert) for layer in layers for expert in range(total)]


def prepare_job_get(*, job_id: str) -> PrepareJob:
    try:
        key = uuid.UUID(str(job_id))
    except ValueError as exc:
        raise InvalidInput(f"job_id {job_id!r} is not a UUID") from exc
    job = PrepareJob.objects.filter(pk=key).first()
    if job is None:
        raise NotFound(f"no prepare job {job_id}", reason="job_not_found")
    return job


def _blob(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if not entry:
        return None
    return {"blob_uri": blob_uri(entry["hash"]), "size": entry["size"], **({"formats": entry["formats"]}
                                                                           if "formats" in entry else {})}


def prepare_job_to_dict(job: PrepareJob) -> dict[str, Any]:
    done = job.results.get("experts", {})
    dense = job.results.get("dense")  # known once a dense job has read the checkpoint
    experts = [
        {"expert": e, "state": "done" if str(e) in done else ("failed" if job.state == "failed" else "pending"),
         **(_blob(done.get(str(e))) or {}), **({"rows": dense["bounds"][e]} if dense else {})}
        for e in job.experts
    ]
    return {
        "job_id": str(job.id),
        "state": job.state,
        "model_id": job.model_id,
        "layer": job.layer,
        "quant": job.quant,
        "checkpoint": job.checkpoint,
        "dense_slices": job.dense_slices,
        "dense": None if dense is None else {k: dense[k] for k in ("d_model", "d_ff", "slice_align")},
        "progress": {"done": len(done), "total": len(job.experts)},
        "gate": _blob(job.results.get("gate")),
        "experts": experts,
        "error": {"reason": job.error_reason, "message": job.error} if job.state == "failed" else None,
        "attempts": job.attempts,
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }


def referenced_blob_hashes() -> set[str]:
    """Every blob a prepare job published (garbage collection keeps them)."""
    hashes: set[str] = set()
    for results in PrepareJob.objects.values_list("results", flat=True):
        if results.get("gate"):
            hashes.add(results["gate"]["hash"])
        hashes.update(entry["hash"] for entry in results.get("experts", {}).values())
    return hashes


@dataclass(frozen=True)
class PreparedExpert:
    """An expert a prepare job on this node published: where it came from and the blob it became."""

    layer: int
    expert: int
    blob_hash: str
    checkpoint: str
    quant: Any


def prepared_experts(model_id: str | None = None) -> dict[str, dict[tuple[int, int], PreparedExpert]]:
    """{model_id: {(layer, expert): PreparedExpert}} of the MoE experts prepare jobs here published,
    the latest job's entry when several published the same expert. This node can publish them again
    (same checkpoint, same quant: the same bytes, the same blob hash) if every copy is lost."""
    jobs = PrepareJob.objects.filter(state=JobState.DONE, dense_slices__isnull=True).order_by("finished_at")
    if model_id is not None:
        jobs = jobs.filter(model_id=model_id)
    out: dict[str, dict[tuple[int, int], PreparedExpert]] = {}
    for job in jobs.only("model_id", "layer", "quant", "checkpoint", "results"):
        for expert, entry in (job.results.get("experts") or {}).items():
            out.setdefault(job.model_id, {})[(job.layer, int(expert))] = PreparedExpert(
                job.layer, int(expert), entry["hash"], job.checkpoint, job.quant)
    return out
