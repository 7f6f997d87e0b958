"""The web process's side of the operator door: calls to this node's expert worker.

Calls are posted to the worker's mailbox WORKER_CALLS (apps/worker/mailbox.py), each naming a fresh
reply mailbox (so concurrent calls never see each other's answers) and a deadline: the worker drops a call
whose deadline passed before it started computing, and stops waiting on one that runs past
it, so a timed-out call here does not keep a compute thread busy there. Hidden rows and
payloads travel as raw bytes; the worker validates them (shape, NaN), once.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from apps.worker import mailbox
from core.errors import Unavailable, error_for_reason

WORKER_CALLS = "tenzro:worker:calls"
REPLY_PREFIX = "tenzro:worker:reply:"


async def worker_call(
    method: str, params: dict[str, Any], *, body: bytes = b"", timeout_s: float | None = None, door: str = "operator",
    peer: str | None = None,
) -> tuple[dict[str, Any], bytes]:
    """Ask the expert worker; raise Unavailable when it does not answer in time.

    `door` "peer" relays a call that reached this web process through the HTTP fallback of the
    peer door (apps/worker/views.py): the worker serves it exactly as if it came over QUIC, `peer`
    (the caller's address) counted as that peer."""
    timeout = settings.TENZRO_WORKER_TIMEOUT_S if timeout_s is None else timeout_s
    reply = REPLY_PREFIX + uuid.uuid4().hex
    try:
        await mailbox.post(WORKER_CALLS, {"method": method, "params": params, "body": body, "reply": reply,
                                          "deadline": time.time() + timeout, "door": door, "peer": peer})
        answer = await mailbox.take(reply, timeout)
    except (RedisError, OSError) as exc:
        # The mailboxes are this node's Redis: down or restarting, no call reaches the worker.
        raise Unavailable(f"{method} cannot reach the expert worker: Redis does not answer "
                          f"({type(exc).__name__}: {exc})", reason="redis_unavailable") from exc
    if answer is None:
        raise Unavailable(f"the expert worker did not answer {method} within {timeout} s",
                          reason="worker_unavailable")
    if not answer.get("ok"):
        details = answer.get("details") if isinstance(answer.get("details"), dict) else {}
        raise error_for_reason(answer.get("reason", "internal_error"), answer.get("message", "worker error"), **details)
    return answer["result"], answer.get("body", b"")


def _with_ids(params: dict[str, Any], ids: dict[str, Any]) -> dict[str, Any]:
    return {**params, **{k: v for k, v in ids.items() if v is not None}}


async def expert_load(*, source: dict[str, Any], expect: dict[str, Any]) -> dict[str, Any]:
    """source: {"payload": bytes} | {"path": str} | {"blob_uri": str}; expect: ids the payload must carry."""
    params = _with_ids({k: v for k, v in source.items() if k != "payload"}, expect)
    result, _ = await worker_call("moe/expert_load", params, body=source.get("payload", b""))
    return result


async def gate_load(*, source: dict[str, Any], expect: dict[str, Any]) -> dict[str, Any]:
    params = _with_ids({k: v for k, v in source.items() if k != "payload"}, expect)
    result, _ = await worker_call("moe/gate_load", params, body=source.get("payload", b""))
    return result


async def expert_unload(*, model_id: str, layer: int, expert: int) -> dict[str, Any]:
    result, _ = await worker_call("moe/expert_unload", {"model_id": model_id, "layer": layer, "expert": expert})
    return result


async def gate_unload(*, model_id: str, layer: int) -> dict[str, Any]:
    result, _ = await worker_call("moe/gate_unload", {"model_id": model_id, "layer": layer})
    return result


async def expert_status_live() -> dict[str, Any]:
    """The runtime's own status, read from the worker now (tenzro_moeExpertStatus with live)."""
    result, _ = await worker_call("moe/expert_status", {})
    return {**result, "stale": False, "published_at": None, "heartbeat_age_s": 0.0, "degraded": []}


async def worker_status() -> dict[str, Any]:
    """The worker's own moe/status: proves it answers right now (liveness, not holdings)."""
    result, _ = await worker_call("moe/status", {})
    return result


async def route(*, model_id: str, layer: int, d_model: int, rows: bytes) -> dict[str, Any]:
    """Routing of each token: {tokens, routings: [{token_index, experts: [{layer, expert, weight}]}]}."""
    result, _ = await worker_call("moe/route", {"model_id": model_id, "layer": layer, "d_model": d_model}, body=rows)
    routings = [
        {"token_index": t, "experts": [{"layer": layer, "expert": e, "weight": w} for e, w in zip(es, ws, strict=True)]}
        for t, (es, ws) in enumerate(zip(result["experts"], result["weights"], strict=True))
    ]
    return {"tokens": len(routings), "routings": routings}


async def execute(*, model_id: str, layer: int, expert: int, d_model: int, rows: bytes) -> tuple[dict, bytes]:
    """One expert over raw f32 rows -> ({tokens, d_model}, raw f32 output rows)."""
    params = {"model_id": model_id, "layer": layer, "expert": expert, "d_model": d_model}
    return await worker_call("moe/execute", params, body=rows)


async def forward(*, model_id: str, layer: int, d_model: int, rows: bytes,
                  options: dict[str, Any] | None = None) -> tuple[dict, bytes]:
    """The distributed forward (moe/forward) -> ({tokens, d_model, missing, lost_gate_mass, stats},
    raw f32 output rows). `options`: allow_partial, allow_cold, min_gate_mass, wire."""
    params = {"model_id": model_id, "layer": layer, "d_model": d_model, **(options or {})}
    return await worker_call("moe/forward", params, body=rows)
