"""Resolving a blob: local copy, then sources in order, every answer hashed before it is kept."""

from dataclasses import dataclass

import pytest

from apps.blobs.resolver import resolve_blob
from apps.blobs.store import BlobError, BlobStore, blob_hash


@dataclass
class FakeSource:
    name: str
    data: bytes | None = None
    error: BlobError | None = None
    calls: int = 0

    def fetch(self, hash_, *, max_bytes):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.data


def test_sources_are_tried_in_order_and_lying_ones_are_passed_over(tmp_path) -> None:
    store = BlobStore(tmp_path)
    data = b"expert bytes" * 100
    h = blob_hash(data)
    down = FakeSource("quic a", error=BlobError("fetch_failed", "timeout"))
    liar = FakeSource("quic b", data=b"other bytes")  # a source that skipped its own hash check
    good = FakeSource("http c", data=data)
    later = FakeSource("http d", data=data)
    resolved = resolve_blob(store, h, sources=[down, liar, good, later], max_bytes=1 << 20)
    assert resolved.data == data and resolved.source == "http c" and later.calls == 0
    assert store.read(h) == data
    again = resolve_blob(store, h, sources=[down], max_bytes=1 << 20)
    assert again.source is None and down.calls == 1  # stored now: no source asked


def test_no_source_serving_the_right_bytes_stores_nothing(tmp_path) -> None:
    store = BlobStore(tmp_path)
    h = blob_hash(b"wanted")
    with pytest.raises(BlobError) as info:
        resolve_blob(store, h, sources=[FakeSource("quic a", data=b"forged")], max_bytes=1 << 20)
    assert info.value.reason == "hash_mismatch" and not store.has(h)
    with pytest.raises(BlobError) as info:
        resolve_blob(store, h, sources=[], max_bytes=1 << 20)
    assert info.value.reason == "not_found" and "no peer known" in str(info.value)
