"""Getting a blob's verified bytes: from the local store, else from the first source that has it.

Pure module (no Django): the expert worker resolves `tenzro://blob/<hash>` loads with it. A
source is anything with a `name` and a `fetch(hash, max_bytes)` returning bytes or raising
BlobError: `HttpBlobSource` here (`GET <peer>/blobs/<hash>`), `QuicBlobSource` in
apps/blobs/quic_fetch.py (`blob/get` on a peer's QUIC door, pinned to its signed record). Every
answer is hashed before it is stored or used; nothing unverified is ever kept.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from apps.blobs.store import BlobError, BlobStore, blob_hash, fetch_blob

log = logging.getLogger(__name__)


class BlobSource(Protocol):
    name: str  # "quic" or "http", plus where: shown in errors and counted by the worker

    def fetch(self, hash_: str, *, max_bytes: int) -> bytes: ...


@dataclass(frozen=True)
class HttpBlobSource:
    base_url: str

    @property
    def name(self) -> str:
        return f"http {self.base_url}"

    def fetch(self, hash_: str, *, max_bytes: int) -> bytes:
        return fetch_blob(f"{self.base_url.rstrip('/')}/blobs/{hash_}", hash_, max_bytes=max_bytes)


@dataclass(frozen=True)
class Resolved:
    data: bytes
    source: str | None  # None: it was already stored here


def resolve_blob(store: BlobStore, hash_: str, *, sources: Sequence[BlobSource], max_bytes: int) -> Resolved:
    """The bytes of blob `hash_`, verified against the hash before they are returned.

    A local copy that no longer matches its hash (disk corruption, tampering) is deleted and
    fetched again. Sources are asked in order; the first verified answer is stored atomically.
    Raises BlobError: `hash_mismatch` when a source served wrong bytes and none served right
    ones, else `not_found`.
    """
    if store.has(hash_):
        data = store.read(hash_)
        if blob_hash(data) == hash_:
            return Resolved(data, None)
        log.warning("stored blob %s does not match its hash; deleting it and fetching again", hash_)
        store.delete(hash_)
    failures: list[tuple[str, BlobError]] = []
    for source in sources:
        try:
            data = source.fetch(hash_, max_bytes=max_bytes)
        except BlobError as exc:
            failures.append((source.name, exc))
            continue
        if blob_hash(data) != hash_:  # a source's own check is not trusted blindly
            failures.append((source.name, BlobError("hash_mismatch", f"{source.name} served other bytes")))
            continue
        store.put_verified(data, hash_)
        for name, exc in failures:  # the sources tried first: say why they were passed over
            log.info("blob %s: %s failed before %s served it: %s", hash_[:16], name, source.name, exc)
        return Resolved(data, source.name)
    tried = "; ".join(f"{name}: {exc}" for name, exc in failures) or "no peer known to hold it"
    reason = "hash_mismatch" if any(exc.reason == "hash_mismatch" for _, exc in failures) else "not_found"
    raise BlobError(reason, f"blob {hash_} is not stored here and no peer served it ({tried})")
