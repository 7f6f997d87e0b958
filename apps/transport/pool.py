"""One pinned QUIC connection per peer, shared by every call to it (streams multiplex on it).

Interim version: connections are opened lazily (concurrent first calls share one handshake),
reused, and dropped when they fail so the next call reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

from apps.transport.quic import QuicPeerConnection, QuicSettings, TransportError, quic_connection

_DEAD = {"connection_closed", "connection_failed", "certificate_pin_mismatch"}


class QuicPool:
    def __init__(self, settings: QuicSettings, *, connect_timeout_s: float = 5.0, idle_close_s: float = 60.0) -> None:
        self._settings = settings
        self._connect_timeout_s = connect_timeout_s
        self._idle_close_s = idle_close_s
        self._open: dict[tuple[str, int, str], tuple[contextlib.AbstractAsyncContextManager, QuicPeerConnection]] = {}
        self._locks: dict[tuple[str, int, str], asyncio.Lock] = {}
        self._counts: Counter[str] = Counter()

    async def _connection(self, key: tuple[str, int, str]) -> QuicPeerConnection:
        async with self._locks.setdefault(key, asyncio.Lock()):
            held = self._open.get(key)
            if held is not None:
                return held[1]
            host, port, pin = key
            opening = quic_connection(host=host, port=port, pin_sha256=pin, settings=self._settings,
                                      timeout_s=self._connect_timeout_s)
            connection = await opening.__aenter__()
            self._counts["handshakes"] += 1
            self._open[key] = (opening, connection)
            return connection

    async def _drop(self, key: tuple[str, int, str]) -> None:
        held = self._open.pop(key, None)
        if held is not None:
            self._counts["dropped"] += 1
            with contextlib.suppress(Exception):
                await held[0].__aexit__(None, None, None)

    async def call(self, *, host: str, port: int, pin_sha256: str, method: str, params: dict[str, Any],
                   body: bytes | bytearray | memoryview = b"", timeout_s: float
                   ) -> tuple[dict[str, Any], bytes | bytearray]:
        key = (host, port, pin_sha256.lower())
        self._counts["calls"] += 1
        try:
            connection = await self._connection(key)
            return await connection.call(method, params, body, timeout_s=timeout_s)
        except TransportError as exc:
            self._counts["failures"] += 1
            if exc.reason in _DEAD:
                await self._drop(key)
            raise

    async def close(self) -> None:
        for key in list(self._open):
            await self._drop(key)

    def stats(self) -> dict[str, int]:
        return {"open": len(self._open), **self._counts}
