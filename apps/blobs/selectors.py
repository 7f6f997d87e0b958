"""Reads of this node's blob store."""

from functools import cache

from django.conf import settings

from apps.blobs.store import BlobStore


@cache
def blob_store() -> BlobStore:
    return BlobStore(settings.TENZRO_DATA_DIR / "blobs")
