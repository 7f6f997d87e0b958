"""The expert worker's methods, shared by its two front doors: QUIC streams from peers
and Channels-layer messages from this node's web process."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from apps.node.identity import NodeIdentity
from apps.transport.quic import HandlerError

Result = tuple[dict[str, Any], bytes]


class WorkerMethods:
    """Dispatch table of the worker; each method returns (result, body bytes).

    `extra` adds the handlers of other parts (the expert runtime's moe/* methods).
    """

    def __init__(
        self,
        *,
        identity: NodeIdentity,
        extra: dict[str, Callable[[dict[str, Any], bytes], Awaitable[Result]]] | None = None,
    ) -> None:
        self._identity = identity
        self._started = time.monotonic()
        self._table = {"moe/status": self.moe_status, **(extra or {})}

    async def __call__(self, method: str, params: dict[str, Any], body: bytes) -> Result:
        func = self._table.get(method)
        if func is None:
            raise HandlerError("method_not_found", f"unknown worker method {method!r}")
        return await func(params, body)

    async def moe_status(self, params: dict[str, Any], body: bytes) -> Result:
        return {
            "provider_id": self._identity.provider_id,
            "quic_cert_sha256": self._identity.cert_sha256,
            "roles": list(settings.TENZRO_ROLES),
            "version": settings.TENZRO_VERSION,
            "uptime_s": round(time.monotonic() - self._started, 3),
            "pid": os.getpid(),
        }, b""
