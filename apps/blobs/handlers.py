"""The expert worker's `blob/*` methods (QUIC): serve stored blobs to peers."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor
from typing import Any

from apps.blobs.store import BlobError, BlobStore
from apps.transport.quic import HandlerError

Result = tuple[dict[str, Any], bytes]


class BlobHandlers:
    def __init__(self, *, store: BlobStore, executor: Executor) -> None:
        self.store = store
        self._executor = executor

    def table(self) -> dict[str, Any]:
        return {"blob/get": self.blob_get}

    async def blob_get(self, params: dict[str, Any], body: bytes) -> Result:
        """params {hash, start=0, end=null (exclusive)} -> {hash, size, start, end}, body = the bytes."""
        start, end = params.get("start", 0), params.get("end")
        if not isinstance(start, int) or (end is not None and not isinstance(end, int)):
            raise HandlerError("invalid_input", "start and end must be integers")
        read = functools.partial(self._read, str(params.get("hash", "")), start, end)
        try:
            size, data = await asyncio.get_running_loop().run_in_executor(self._executor, read)
        except BlobError as exc:
            raise HandlerError("blob_not_found" if exc.reason == "not_found" else exc.reason, str(exc)) from exc
        return {"hash": params["hash"], "size": size, "start": start, "end": start + len(data)}, data

    def _read(self, hash_: str, start: int, end: int | None) -> tuple[int, bytes]:
        return self.store.size(hash_), self.store.read(hash_, start, end)
