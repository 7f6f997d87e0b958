"""Writes of the blob store: garbage collection."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from apps.blobs.selectors import blob_store
from apps.blobs.store import parse_blob_uri
from apps.catalog.selectors import referenced_blob_hashes
from apps.experts.services import expert_status


async def blob_gc(*, min_age_s: float) -> dict[str, Any]:
    """Delete every blob that no holding (expert or gate) and no prepare job references.

    The holdings come from the expert worker; if it does not answer, nothing is deleted
    (Unavailable is raised) rather than guessing which blobs are in use.
    """
    status = await expert_status()
    referenced = {parse_blob_uri(row["blob_uri"]) for row in (*status["experts"], *status["gates"])
                  if row.get("blob_uri")}
    referenced |= await sync_to_async(referenced_blob_hashes)()
    store = blob_store()
    removed = await sync_to_async(store.gc, thread_sensitive=False)(referenced, min_age_s=min_age_s)
    return {"removed": removed, "kept": len(store.hashes()), "referenced": len(referenced)}
