"""Fetching a blob from a peer's QUIC door (`blob/get`), in ranges, pinned to its certificate.

Called from a worker thread (the blob resolver blocks); the QUIC calls run on the worker's
event loop, handed over with run_coroutine_threadsafe.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from blake3 import blake3

from apps.blobs.store import BlobError
from core.env import split_host_port
from core.transport.quic import QuicSettings, TransportError, quic_connection

CHUNK_BYTES = 32 << 20  # one blob/get answer: well under TENZRO_QUIC_MAX_BODY


@dataclass(frozen=True)
class QuicBlobSource:
    endpoint: str  # host:port from the peer's signed record
    pin_sha256: str
    loop: asyncio.AbstractEventLoop
    timeout_s: float = 120.0

    @property
    def name(self) -> str:
        return f"quic {self.endpoint}"

    def fetch(self, hash_: str, *, max_bytes: int) -> bytes:
        future = asyncio.run_coroutine_threadsafe(self._fetch(hash_, max_bytes), self.loop)
        return future.result(timeout=self.timeout_s)

    async def _fetch(self, hash_: str, max_bytes: int) -> bytes:
        host, port = split_host_port(self.endpoint, what="quic endpoint")
        settings = QuicSettings(max_body=CHUNK_BYTES + (1 << 20))
        parts, hasher, start, size = [], blake3(), 0, None
        try:
            async with quic_connection(host=host, port=port, pin_sha256=self.pin_sha256,
                                       settings=settings) as peer:
                while size is None or start < size:
                    result, body = await peer.call("blob/get", {"hash": hash_, "start": start,
                                                                "end": start + CHUNK_BYTES}, timeout_s=self.timeout_s)
                    size = int(result.get("size", -1))
                    if size > max_bytes:
                        raise BlobError("too_large", f"{self.name}: blob of {size} bytes exceeds {max_bytes}")
                    if not body and start < size:
                        raise BlobError("fetch_failed", f"{self.name}: empty range at {start} of {size}")
                    parts.append(bytes(body))
                    hasher.update(body)
                    start += len(body)
        except TransportError as exc:
            reason = "not_found" if exc.reason == "blob_not_found" else "fetch_failed"
            raise BlobError(reason, f"{self.name}: {exc.reason}: {exc}") from exc
        if hasher.hexdigest() != hash_:
            raise BlobError("hash_mismatch", f"{self.name}: {start} bytes hash to {hasher.hexdigest()}")
        return b"".join(parts)
