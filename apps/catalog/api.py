"""JSON-RPC/REST methods of the model catalog and prepare jobs."""

import uuid
from typing import Any, Literal

from ninja import Field
from pydantic import ConfigDict, model_validator

from apps.api.registry import rpc_method
from apps.api.schemas import DB_INT_MAX, Int, Out, Params, QueryParams, absent_or, bounded_int
from apps.catalog import selectors, services
from apps.catalog.shapes import shape_to_dict
from core.formats.gate_payload import MAX_DENSE_SLICES
from core.quantization.presets import PRESETS
from core.quantization.types import GGMLType

# Spelled as the schema enumerates them; resolve_quant accepts exactly these.
Preset = Literal[tuple(sorted(PRESETS))]  # type: ignore[valid-type]
TypeName = Literal[tuple(sorted({t.value for t in GGMLType} | {t.value.lower() for t in GGMLType}))]  # type: ignore[valid-type]


class PerProjectionQuant(Params):
    gate: TypeName
    up: TypeName
    down: TypeName


class CatalogShapeParams(QueryParams):
    model: str = Field(min_length=1, max_length=200, description="Catalog model id, e.g. qwen3-30b-a3b.")
    checkpoint: str = absent_or(min_length=1, max_length=4096,
                                description="For a model not in the catalog: read its config.json here.")


class PrepareParams(Params):
    # experts, dense_slices or both: an MoE layer's experts by id, or a dense layer's d_ff slices
    model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": ["experts"]},
                                                           {"required": ["dense_slices"]}]})

    model_id: str = Field(min_length=1, max_length=200)
    layer: Int = Field(ge=0, le=DB_INT_MAX)
    experts: list[bounded_int(0, DB_INT_MAX)] = absent_or(  # type: ignore[valid-type]
        min_length=1, max_length=4096,
        description="Expert ids of an MoE layer; with dense_slices, the slice ids to publish (default all).")
    dense_slices: Int = absent_or(
        ge=1, le=MAX_DENSE_SLICES,
        description="Cut a dense (non-MoE) layer into this many d_ff slices, published as experts 0..n-1 "
                    "under a dense gate (docs/protocol.md 'Gate payloads').")
    quant: Preset | PerProjectionQuant | None = Field(
        None, description='Preset ("q4_k_m", "q8_0", …), one type per projection, or null for dense f32.')
    checkpoint: str = absent_or(min_length=1, max_length=4096,
                                description="Checkpoint folder or http(s) URL (default: the catalog's).")

    @model_validator(mode="after")
    def _experts_or_dense_slices(self) -> "PrepareParams":
        if self.experts is None and self.dense_slices is None:
            raise ValueError("give experts (an MoE layer's expert ids), dense_slices (a dense layer), or both")
        return self


class PrepareStatusParams(QueryParams):
    job_id: uuid.UUID


class ModelShapeOut(Out):
    model_id: str
    family: str | None
    n_routed_experts: int | None
    n_active: int | None
    n_shared_experts: int | None
    n_experts_total: int | None
    n_layers: int | None
    moe_layers: list[int] | None
    moe_layer_rule: str | None
    d_model: int | None
    expert_d_ff: int | None
    router: str | None
    norm_topk_prob: bool | None
    routed_scaling_factor: float | None
    n_group: int | None
    topk_group: int | None
    checkpoint_layout: str | None
    default_source: str | None
    sources: dict[str, str]


class BlobOut(Out):
    blob_uri: str
    size: int


class JobExpertOut(Out):
    expert: int
    state: Literal["pending", "done", "failed"]
    blob_uri: str | None = None
    size: int | None = None
    formats: dict[str, str] | None = None
    rows: list[int] | None = Field(None, description="A dense slice's d_ff rows [start, end).")


class DenseOut(Out):
    d_model: int
    d_ff: int
    slice_align: int = Field(description="Rows per block of the cut (the down projection's quant block).")


class Progress(Out):
    done: int
    total: int


class JobError(Out):
    reason: str
    message: str


class PrepareJobOut(Out):
    job_id: str
    state: Literal["queued", "running", "done", "failed"]
    model_id: str
    layer: int
    quant: str | dict[str, str] | None
    checkpoint: str
    dense_slices: int | None
    dense: DenseOut | None = Field(description="A dense job's layer, once the job has read the checkpoint.")
    progress: Progress
    gate: BlobOut | None
    experts: list[JobExpertOut]
    error: JobError | None
    attempts: int
    created_at: str
    started_at: str | None
    finished_at: str | None


@rpc_method("tenzro_moeCatalogShape", rest="/moe/catalog/shape", http_method="GET", tag="catalog",
            params=CatalogShapeParams, response=ModelShapeOut, errors=(404,))
def catalog_shape(params: CatalogShapeParams) -> dict[str, Any]:
    """Routed/active/shared experts, layers, d_model, expert d_ff and router family of a model.

    A shape read from a checkpoint is remembered: the shard map then lists the model's uncovered experts."""
    shape = selectors.model_shape(model_id=params.model, checkpoint=params.checkpoint)
    if params.checkpoint is not None and not selectors.in_catalog(params.model):
        services.known_shape_remember(shape, source=params.checkpoint)
    return shape_to_dict(shape)


@rpc_method("tenzro_moePrepareExperts", rest="/moe/prepare", tag="catalog", params=PrepareParams,
            response=PrepareJobOut, operator_only=True,
            links={"status": {"operationId": "tenzro_moePrepareStatus",
                              "parameters": {"job_id": "$response.body#/job_id"}}})
def prepare_experts(params: PrepareParams) -> dict[str, Any]:
    """Queue a job that slices a layer's experts (or a dense layer's d_ff slices) and gate from a checkpoint,
    quantizes and publishes them."""
    quant = params.quant.model_dump() if isinstance(params.quant, PerProjectionQuant) else params.quant
    job = services.prepare_job_create(model_id=params.model_id, layer=params.layer, experts=params.experts,
                                      quant=quant, checkpoint=params.checkpoint, dense_slices=params.dense_slices)
    return selectors.prepare_job_to_dict(job)


@rpc_method("tenzro_moePrepareStatus", rest="/moe/prepare/status", http_method="GET", tag="catalog",
            params=PrepareStatusParams, response=PrepareJobOut, errors=(404,))
def prepare_status(params: PrepareStatusParams) -> dict[str, Any]:
    """A prepare job's state, per-expert progress and the tenzro://blob/ URIs it published."""
    return selectors.prepare_job_to_dict(selectors.prepare_job_get(job_id=str(params.job_id)))
