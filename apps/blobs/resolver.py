"""Getting a blob's verified bytes: from the local store, else from a peer (then stored).

Pure module (no Django): the expert worker resolves `tenzro://blob/<hash>` loads with it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from apps.blobs.store import BlobError, BlobStore, blob_hash, fetch_blob

log = logging.getLogger(__name__)


def resolve_blob(store: BlobStore, hash_: str, *, peers: Sequence[str], max_bytes: int) -> bytes:
    """The bytes of blob `hash_`, verified against the hash before they are returned.

    A local copy that no longer matches its hash (disk corruption, tampering) is deleted and
    fetched again. Peers are asked in order over HTTP (`GET <peer>/blobs/<hash>`); the first
    verified answer is stored atomically. Raises BlobError: `hash_mismatch` when a peer served
    wrong bytes and none served right ones, else `not_found`. Nothing unverified is stored.
    """
    if store.has(hash_):
        data = store.read(hash_)
        if blob_hash(data) == hash_:
            return data
        log.warning("stored blob %s does not match its hash; deleting it and fetching again", hash_)
        store.delete(hash_)
    failures: list[BlobError] = []
    for peer in peers:
        try:
            data = fetch_blob(f"{peer.rstrip('/')}/blobs/{hash_}", hash_, max_bytes=max_bytes)
        except BlobError as exc:
            failures.append(exc)
            continue
        store.put_verified(data, hash_)
        return data
    tried = "; ".join(str(exc) for exc in failures) or "no peers configured"
    reason = "hash_mismatch" if any(exc.reason == "hash_mismatch" for exc in failures) else "not_found"
    raise BlobError(reason, f"blob {hash_} is not stored here and no peer served it ({tried})")
