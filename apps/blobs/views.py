"""GET/HEAD /blobs/<hash>: blob bytes with single-range Range support (RFC 9110 §14)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse, StreamingHttpResponse

from apps.blobs.selectors import blob_store
from apps.blobs.store import BlobError

CHUNK = 1024 * 1024
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end exclusive) of a single `bytes=` range, None for the whole blob.

    Raises ValueError for a range that cannot be satisfied (answered 416).
    """
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None or match.groups() == ("", ""):
        raise ValueError(f"unsupported Range {header!r} (one bytes=start-end range)")
    first, last = match.groups()
    if first == "":  # suffix: the last N bytes
        length = int(last)
        if length == 0:
            raise ValueError("empty suffix range")
        return max(0, size - length), size
    start = int(first)
    end = size if last == "" else min(int(last) + 1, size)
    if start >= size or end <= start:
        raise ValueError(f"range {header!r} outside a {size}-byte blob")
    return start, end


async def _chunks(path: Path, start: int, end: int) -> AsyncIterator[bytes]:
    handle = await asyncio.to_thread(path.open, "rb")
    try:
        await asyncio.to_thread(handle.seek, start)
        remaining = end - start
        while remaining > 0:
            chunk = await asyncio.to_thread(handle.read, min(CHUNK, remaining))
            if not chunk:
                break
            remaining -= len(chunk)
            yield chunk
    finally:
        handle.close()


async def blob_get(request: HttpRequest, blob_hash: str) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    store = blob_store()
    try:
        size = store.size(blob_hash)
    except BlobError as exc:
        status = 404 if exc.reason == "not_found" else 400
        return JsonResponse({"detail": str(exc), "reason": exc.reason}, status=status)
    try:
        byte_range = parse_range(request.headers.get("Range"), size)
    except ValueError as exc:
        response = JsonResponse({"detail": str(exc), "reason": "range_invalid"}, status=416)
        response["Content-Range"] = f"bytes */{size}"
        return response
    start, end = byte_range or (0, size)
    if request.method == "HEAD":
        response = HttpResponse(status=206 if byte_range else 200)
    else:
        response = StreamingHttpResponse(_chunks(store.path(blob_hash), start, end), status=206 if byte_range else 200)
    response["Content-Type"] = "application/octet-stream"
    response["Content-Length"] = str(end - start)
    response["Accept-Ranges"] = "bytes"
    response["ETag"] = f'"{blob_hash}"'
    # Content-addressed: the bytes behind a hash never change.
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    if byte_range:
        response["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    return response
