"""The expert worker's methods, shared by its two front doors: QUIC streams from peers
and Channels-layer messages from this node's web process."""

from __future__ import annotations

import os
import time
from typing import Any

from django.conf import settings

from apps.node.identity import NodeIdentity
from apps.transport.quic import HandlerError


class WorkerMethods:
    """Dispatch table of the worker; each method returns (result, body bytes)."""

    def __init__(self, *, identity: NodeIdentity) -> None:
        self._identity = identity
        self._started = time.monotonic()
        self._table = {"moe/status": self.moe_status}

    async def __call__(self, method: str, params: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        func = self._table.get(method)
        if func is None:
            raise HandlerError("method_not_found", f"unknown worker method {method!r}")
        return await func(params, body)

    async def moe_status(self, params: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        return {
            "provider_id": self._identity.provider_id,
            "quic_cert_sha256": self._identity.cert_sha256,
            "roles": list(settings.TENZRO_ROLES),
            "version": settings.TENZRO_VERSION,
            "uptime_s": round(time.monotonic() - self._started, 3),
            "pid": os.getpid(),
        }, b""
