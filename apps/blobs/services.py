"""Writes of the blob store: garbage collection."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.blobs.references import referenced_blob_hashes
from apps.blobs.selectors import blob_store


def blob_gc(*, min_age_s: float) -> dict[str, Any]:
    """Delete every blob that nothing registered in apps/blobs/references.py still names, once it is
    older than `min_age_s` and TENZRO_BLOB_GRACE_S (an unload dates its expert's blob afresh:
    core/experts/tiered_cache.py).

    The references are read from the control plane (the worker's published holdings, the
    prepare jobs); a source that cannot answer raises, and then nothing is deleted.
    """
    referenced = referenced_blob_hashes()
    store = blob_store()
    removed = store.gc(referenced, min_age_s=max(min_age_s, settings.TENZRO_BLOB_GRACE_S))
    return {"removed": removed, "kept": len(store.hashes()), "referenced": len(referenced)}
