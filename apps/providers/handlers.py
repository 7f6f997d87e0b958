"""The expert worker's `gossip/*` methods (the peer door declares them in apps/worker/doors.py)."""

from __future__ import annotations

from typing import Any

from apps.providers.peer_methods import PEER_METHODS

Result = tuple[dict[str, Any], bytes]


def gossip_handlers(parts: Any = None) -> dict[str, Any]:
    """Worker handlers (params, body, ctx) over the shared peer methods."""

    def bind(method: Any) -> Any:
        async def handler(params: dict[str, Any], body: bytes | bytearray, ctx: Any) -> Result:
            peer = getattr(ctx, "peer", None)
            return await method(params, peer_host=peer[0] if peer else None), b""

        return handler

    return {name: bind(method) for name, method in PEER_METHODS.items()}
