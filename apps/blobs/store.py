"""Content-addressed blob store: ``tenzro://blob/<hash>``, hash = BLAKE3 of the bytes (lowercase hex).

Layout under the root (the node's data dir ``blobs/``)::

    <root>/<hh>/<hash>        hh = the hash's first two hex digits
    <root>/<hh>/.tmp-*        a write in progress (never listed, never served)

A blob file only ever appears whole: bytes go to a temp file in the same directory, are
fsynced, then ``os.replace``d onto the final name (atomic on POSIX), and the directory is
fsynced so the rename survives a crash. Writing the same bytes twice is a no-op, so two
writers racing on one hash both succeed with identical contents.

Pure module (blake3 + httpx), never Django.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import httpx
from blake3 import blake3

from core.durable_files import TMP_PREFIX, write_atomic
from core.errors import TenzroError

BLOB_URI_PREFIX = "tenzro://blob/"
_HASH = re.compile(r"^[0-9a-f]{64}$")


class BlobError(TenzroError, ValueError):
    """A blob operation that failed. ``reason``: invalid_hash, invalid_uri, not_found, hash_mismatch,
    too_large, fetch_failed, range_invalid."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)


def blob_hash(data: bytes | bytearray | memoryview) -> str:
    """BLAKE3 of `data`, 64 lowercase hex digits."""
    return blake3(bytes(data) if isinstance(data, memoryview) else data).hexdigest()


def _check_hash(value: object) -> str:
    if not isinstance(value, str) or not _HASH.match(value):
        raise BlobError("invalid_hash", f"blob hash must be 64 lowercase hex digits, received {value!r}")
    return value


def blob_uri(hash_: str) -> str:
    return BLOB_URI_PREFIX + _check_hash(hash_)


def parse_blob_uri(uri: str) -> str:
    """The hash of a ``tenzro://blob/<hash>`` URI; BlobError(invalid_uri / invalid_hash) otherwise."""
    if not isinstance(uri, str) or not uri.startswith(BLOB_URI_PREFIX):
        raise BlobError("invalid_uri", f"blob URI must start with {BLOB_URI_PREFIX!r}, received {uri!r}")
    return _check_hash(uri[len(BLOB_URI_PREFIX):])


class BlobStore:
    """Blobs under `root`, sharded by the first two hex digits of the hash."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, hash_: str) -> Path:
        h = _check_hash(hash_)
        return self.root / h[:2] / h

    def has(self, hash_: str) -> bool:
        return self.path(hash_).is_file()

    def size(self, hash_: str) -> int:
        try:
            return self.path(hash_).stat().st_size
        except FileNotFoundError:
            raise BlobError("not_found", f"blob {hash_} is not stored") from None

    def put(self, data: bytes | bytearray | memoryview) -> str:
        """Store `data` (atomic, idempotent) and return its hash."""
        return self._write(blob_hash(data), data)

    def put_verified(self, data: bytes | bytearray | memoryview, expected_hash: str) -> str:
        """Store `data` only if it hashes to `expected_hash`; on a mismatch nothing is written."""
        expected = _check_hash(expected_hash)
        actual = blob_hash(data)
        if actual != expected:
            raise BlobError("hash_mismatch", f"blob bytes hash to {actual}, expected {expected}; not stored")
        return self._write(actual, data)

    def _write(self, h: str, data: bytes | bytearray | memoryview) -> str:
        final = self.path(h)
        if final.is_file() and final.stat().st_size == len(data):
            return h  # same hash, same bytes: already stored
        write_atomic(final, data)
        return h

    def read(self, hash_: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of a blob (end None = to the end), as for an HTTP Range."""
        path = self.path(hash_)
        try:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                stop = size if end is None else end
                if not 0 <= start <= stop <= size:
                    raise BlobError("range_invalid", f"range [{start}, {end}) outside blob {hash_} of {size} bytes")
                fh.seek(start)
                return fh.read(stop - start)
        except FileNotFoundError:
            raise BlobError("not_found", f"blob {hash_} is not stored") from None

    def delete(self, hash_: str) -> bool:
        """Remove a blob; False when it was not stored."""
        try:
            self.path(hash_).unlink()
        except FileNotFoundError:
            return False
        return True

    def hashes(self) -> list[str]:
        """Every stored hash, sorted (temp files and stray names are skipped)."""
        out = []
        for shard in self.root.iterdir():
            if not (shard.is_dir() and len(shard.name) == 2):
                continue
            out.extend(p.name for p in shard.iterdir() if _HASH.match(p.name) and p.name[:2] == shard.name
                       and p.is_file())
        return sorted(out)

    def gc(self, referenced: set[str], *, min_age_s: float = 0.0) -> list[str]:
        """Delete every blob not in `referenced`; returns the hashes removed (sorted).

        A blob written less than `min_age_s` ago is kept: a job that has just put a blob
        but not yet recorded its reference must not lose it to a concurrent gc. Stale temp
        files older than `min_age_s` (left by a crashed writer) are removed too.
        """
        now = time.time()
        removed = []
        for h in self.hashes():
            if h in referenced:
                continue
            try:
                if now - self.path(h).stat().st_mtime < min_age_s:
                    continue
            except FileNotFoundError:
                continue
            if self.delete(h):
                removed.append(h)
        for tmp in self.root.glob(f"??/{TMP_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):
                if now - tmp.stat().st_mtime >= max(min_age_s, 3600.0):
                    tmp.unlink()
        return removed


def fetch_blob(url: str, expected_hash: str, *, max_bytes: int, client: httpx.Client | None = None,
               timeout_s: float = 60.0) -> bytes:
    """GET `url` (streamed, at most `max_bytes`) and return the body once it hashes to `expected_hash`.

    BlobError reasons: fetch_failed (transport error, non-200), too_large (declared or
    received size over `max_bytes`), hash_mismatch. Nothing is stored here; pass the result
    to BlobStore.put_verified.
    """
    expected = _check_hash(expected_hash)
    own = client is None
    http = client or httpx.Client(follow_redirects=True, timeout=timeout_s)
    try:
        with http.stream("GET", url, headers={"Accept-Encoding": "identity"}) as resp:
            if resp.status_code != 200:
                raise BlobError("fetch_failed", f"GET {url}: HTTP {resp.status_code}")
            declared = resp.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise BlobError("too_large", f"GET {url}: {declared} bytes exceeds the {max_bytes}-byte limit")
            hasher, chunks, total = blake3(), [], 0
            for chunk in resp.iter_bytes():
                total += len(chunk)
                if total > max_bytes:
                    raise BlobError("too_large", f"GET {url}: body exceeds the {max_bytes}-byte limit")
                hasher.update(chunk)
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise BlobError("fetch_failed", f"GET {url}: {type(exc).__name__}: {exc}") from None
    finally:
        if own:
            http.close()
    actual = hasher.hexdigest()
    if actual != expected:
        raise BlobError("hash_mismatch", f"GET {url}: {total} bytes hash to {actual}, expected {expected}")
    return b"".join(chunks)


__all__ = ["BLOB_URI_PREFIX", "BlobError", "BlobStore", "blob_hash", "blob_uri", "fetch_blob", "parse_blob_uri"]
