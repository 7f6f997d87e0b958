"""The expert worker's `blob/*` methods: serve stored blobs to peers.

Which door serves them is decided in apps/worker/doors.py. A read runs on the executor
through the call's context (never on the event loop).
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from apps.blobs.store import BlobError, BlobStore
from core.errors import InvalidInput, NotFound

Result = tuple[dict[str, Any], bytes]


class BlobHandlers:
    def __init__(self, *, store: BlobStore, executor: Executor) -> None:
        self.store = store
        self._executor = executor

    def table(self) -> dict[str, Any]:
        return {"blob/get": self.blob_get}

    async def blob_get(self, params: dict[str, Any], body: bytes | bytearray, ctx: Any) -> Result:
        """params {hash, start=0, end=null (exclusive)} -> {hash, size, start, end}, body = the bytes.

        An `end` past the blob reads to its end (as an HTTP Range does), so a client can ask for
        fixed-size chunks without knowing the size first."""
        start, end = params.get("start", 0), params.get("end")
        if isinstance(start, bool) or not isinstance(start, int) or (
                end is not None and (isinstance(end, bool) or not isinstance(end, int))):
            raise InvalidInput("start and end must be integers")
        hash_ = str(params.get("hash", ""))
        try:
            size, data = await ctx.run_blocking(self._executor, self._read, hash_, start, end)
        except BlobError as exc:
            if exc.reason == "not_found":
                raise NotFound(str(exc), reason="blob_not_found") from exc
            raise
        return {"hash": hash_, "size": size, "start": start, "end": start + len(data)}, data

    def _read(self, hash_: str, start: int, end: int | None) -> tuple[int, bytes]:
        size = self.store.size(hash_)
        return size, self.store.read(hash_, start, None if end is None else min(end, size))
