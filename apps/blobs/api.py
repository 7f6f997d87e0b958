"""JSON-RPC/REST methods of the blob store."""

from typing import Any

from django.conf import settings
from ninja import Field, Schema

from apps.api.registry import rpc_method
from apps.blobs import services


class BlobGcParams(Schema):
    min_age_s: float | None = Field(
        None, ge=0, description="Keep blobs younger than this many seconds (default TENZRO_BLOB_GC_MIN_AGE_S)."
    )


@rpc_method("tenzro_blobGc", rest="/blobs/gc", tag="blobs", params=BlobGcParams, operator_only=True)
async def blob_gc(params: BlobGcParams) -> dict[str, Any]:
    """Delete blobs that no holding and no prepare job references."""
    min_age = settings.TENZRO_BLOB_GC_MIN_AGE_S if params.min_age_s is None else params.min_age_s
    return await services.blob_gc(min_age_s=min_age)
