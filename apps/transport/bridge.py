"""Calls from the web process to this node's expert worker over the Channels layer.

The worker listens on WORKER_CHANNEL; each call carries a fresh reply channel, so
concurrent calls never see each other's answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from apps.api.errors import Unavailable, error_for_reason

WORKER_CHANNEL = "tenzro.worker"


async def worker_call(
    method: str, params: dict[str, Any], *, body: bytes = b"", timeout_s: float | None = None
) -> tuple[dict[str, Any], bytes]:
    """Ask the expert worker; raise Unavailable when it does not answer in time."""
    layer = get_channel_layer()
    reply_channel = await layer.new_channel()
    timeout = settings.TENZRO_WORKER_TIMEOUT_S if timeout_s is None else timeout_s
    await layer.send(
        WORKER_CHANNEL,
        {"type": "worker.call", "method": method, "params": params, "body": body, "reply": reply_channel},
    )
    try:
        answer = await asyncio.wait_for(layer.receive(reply_channel), timeout)
    except TimeoutError as exc:
        raise Unavailable(
            f"the expert worker did not answer {method} within {timeout} s", reason="worker_unavailable"
        ) from exc
    if not answer.get("ok"):
        raise error_for_reason(answer.get("reason", "worker_error"), answer.get("message", "worker error"))
    return answer["result"], answer.get("body", b"")
