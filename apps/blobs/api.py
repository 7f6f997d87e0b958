"""JSON-RPC/REST methods of the blob store."""

from typing import Any

from django.conf import settings

from apps.api.registry import rpc_method
from apps.api.schemas import Out, Params, absent_or
from apps.blobs import services


class BlobGcParams(Params):
    min_age_s: float = absent_or(
        ge=0, le=1e12, description="Keep blobs younger than this many seconds (default TENZRO_BLOB_GC_MIN_AGE_S)."
    )


class BlobGcOut(Out):
    removed: list[str]
    kept: int
    referenced: int


@rpc_method("tenzro_blobGc", rest="/blobs/gc", tag="blobs", params=BlobGcParams, response=BlobGcOut, errors=(409,),
            operator_only=True)
def blob_gc(params: BlobGcParams) -> dict[str, Any]:
    """Delete blobs that no holding and no prepare job references."""
    min_age = settings.TENZRO_BLOB_GC_MIN_AGE_S if params.min_age_s is None else params.min_age_s
    return services.blob_gc(min_age_s=min_age)
