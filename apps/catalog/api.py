"""JSON-RPC/REST methods of the model catalog and prepare jobs."""

from typing import Any

from ninja import Field, Schema

from apps.api.registry import rpc_method
from apps.catalog import selectors, services


class CatalogShapeParams(Schema):
    model: str = Field(description="Catalog model id, e.g. qwen3-30b-a3b.")
    checkpoint: str | None = Field(None, description="For a model not in the catalog: read its config.json here.")


class PrepareParams(Schema):
    model_id: str
    layer: int = Field(ge=0)
    experts: list[int] = Field(min_length=1)
    quant: str | dict[str, str] | None = Field(None, description='Preset ("q4_k_m", "q8_0", …) or per projection.')
    checkpoint: str | None = Field(None, description="Checkpoint folder or http(s) URL (default: the catalog's).")


class PrepareStatusParams(Schema):
    job_id: str


@rpc_method("tenzro_moeCatalogShape", rest="/moe/catalog/shape", http_method="GET", tag="catalog",
            params=CatalogShapeParams)
def catalog_shape(params: CatalogShapeParams) -> dict[str, Any]:
    """Routed/active/shared experts, layers, d_model, expert d_ff and router family of a model."""
    return selectors.model_shape_dict(model_id=params.model, checkpoint=params.checkpoint)


@rpc_method("tenzro_moePrepareExperts", rest="/moe/prepare", tag="catalog", params=PrepareParams, operator_only=True)
def prepare_experts(params: PrepareParams) -> dict[str, Any]:
    """Queue a job that slices a layer's experts (and gate) from a checkpoint, quantizes and publishes them."""
    job = services.prepare_job_create(model_id=params.model_id, layer=params.layer, experts=params.experts,
                                      quant=params.quant, checkpoint=params.checkpoint)
    return selectors.prepare_job_to_dict(job)


@rpc_method("tenzro_moePrepareStatus", rest="/moe/prepare/status", http_method="GET", tag="catalog",
            params=PrepareStatusParams)
def prepare_status(params: PrepareStatusParams) -> dict[str, Any]:
    """A prepare job's state, per-expert progress and the tenzro://blob/ URIs it published."""
    return selectors.prepare_job_to_dict(selectors.prepare_job_get(job_id=params.job_id))
