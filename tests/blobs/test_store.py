"""BlobStore and fetch_blob: content addressing, atomic idempotent writes, ranges, gc, verified fetches."""

from __future__ import annotations

import os
import time

import pytest

from apps.blobs.store import BLOB_URI_PREFIX, BlobError, BlobStore, blob_hash, blob_uri, fetch_blob, parse_blob_uri
from testkit.checkpoints import FileServer

DATA = bytes(range(256)) * 40


def test_hash_and_uri():
    h = blob_hash(DATA)
    assert len(h) == 64 and h == h.lower() and h == blob_hash(memoryview(DATA))
    assert blob_hash(b"") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"  # BLAKE3("")
    assert parse_blob_uri(blob_uri(h)) == h and blob_uri(h) == BLOB_URI_PREFIX + h
    for bad, reason in (("tenzro://blob/" + h.upper(), "invalid_hash"), ("tenzro://blob/abc", "invalid_hash"),
                        ("https://x/" + h, "invalid_uri"), (None, "invalid_uri")):
        with pytest.raises(BlobError) as err:
            parse_blob_uri(bad)
        assert err.value.reason == reason


def test_put_read_ranges_idempotent(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    h = store.put(DATA)
    path = store.path(h)
    assert path == tmp_path / "blobs" / h[:2] / h and path.read_bytes() == DATA
    mtime = path.stat().st_mtime_ns
    assert store.put(DATA) == h and path.stat().st_mtime_ns == mtime  # already stored: not rewritten
    assert store.has(h) and store.size(h) == len(DATA) and store.hashes() == [h]
    assert store.read(h) == DATA and store.read(h, 10, 20) == DATA[10:20] and store.read(h, 100) == DATA[100:]
    assert store.read(h, len(DATA)) == b""
    for start, end in ((-1, None), (5, 4), (0, len(DATA) + 1)):
        with pytest.raises(BlobError) as err:
            store.read(h, start, end)
        assert err.value.reason == "range_invalid"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]  # no temp files left


def test_put_verified_refuses_a_mismatch(tmp_path):
    store = BlobStore(tmp_path)
    with pytest.raises(BlobError) as err:
        store.put_verified(DATA, blob_hash(DATA[:-1]))
    assert err.value.reason == "hash_mismatch" and store.hashes() == []
    assert not any(tmp_path.rglob("*"))  # no shard dir, no temp file
    assert store.put_verified(DATA, blob_hash(DATA)) == blob_hash(DATA)


def test_missing_blob_and_delete(tmp_path):
    store = BlobStore(tmp_path)
    h = blob_hash(b"nothing")
    assert not store.has(h) and not store.delete(h)
    for call in (lambda: store.read(h), lambda: store.size(h)):
        with pytest.raises(BlobError) as err:
            call()
        assert err.value.reason == "not_found"
    with pytest.raises(BlobError):
        store.path("../../etc/passwd")
    h2 = store.put(b"x")
    assert store.delete(h2) and not store.has(h2)


def test_gc_removes_only_unreferenced(tmp_path):
    store = BlobStore(tmp_path)
    keep, drop, fresh = store.put(b"keep"), store.put(b"drop"), store.put(b"fresh")
    old = time.time() - 7200
    for h in (keep, drop):
        os.utime(store.path(h), (old, old))
    stale_tmp = store.path(drop).parent / ".tmp-crashed"
    stale_tmp.write_bytes(b"partial")
    os.utime(stale_tmp, (old, old))
    (tmp_path / "README").write_text("not a blob")
    assert store.gc({keep}, min_age_s=60) == [drop]  # `fresh` is too young to collect
    assert store.hashes() == sorted([keep, fresh]) and not stale_tmp.exists()
    assert store.gc({keep}) == [fresh] and store.hashes() == [keep]


def test_fetch_blob_verifies_before_returning(tmp_path):
    src = tmp_path / "srv"
    src.mkdir()
    (src / "good").write_bytes(DATA)
    h = blob_hash(DATA)
    store = BlobStore(tmp_path / "blobs")
    with FileServer(src) as server:
        assert store.put_verified(fetch_blob(f"{server.url}/good", h, max_bytes=len(DATA)), h) == h
        for url, expected, max_bytes, reason in (
            (f"{server.url}/good", blob_hash(b"other"), 1 << 20, "hash_mismatch"),
            (f"{server.url}/good", h, len(DATA) - 1, "too_large"),
            (f"{server.url}/missing", h, 1 << 20, "fetch_failed"),
            ("http://127.0.0.1:9/none", h, 1 << 20, "fetch_failed"),
        ):
            with pytest.raises(BlobError) as err:
                fetch_blob(url, expected, max_bytes=max_bytes, timeout_s=5)
            assert err.value.reason == reason, str(err.value)
    assert store.hashes() == [h]
