"""Operations on this node's expert runtime, which lives in the expert worker process.

Each call goes to the worker over the Channels layer with raw bytes (payloads, f32 rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from apps.experts.wire import rows_from_bytes, rows_to_bytes
from apps.transport.bridge import worker_call


def _clean(expect: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in expect.items() if v is not None}


async def expert_load(*, source: dict[str, Any], expect: dict[str, Any]) -> dict[str, Any]:
    """source: {"payload": bytes} | {"path": str} | {"blob_uri": str}; expect: ids the payload must carry."""
    body = source.get("payload", b"")
    params = {**_clean(expect), **{k: v for k, v in source.items() if k != "payload"}}
    result, _ = await worker_call("moe/expert_load", params, body=body)
    return result


async def gate_load(*, source: dict[str, Any], expect: dict[str, Any]) -> dict[str, Any]:
    body = source.get("payload", b"")
    params = {**_clean(expect), **{k: v for k, v in source.items() if k != "payload"}}
    result, _ = await worker_call("moe/gate_load", params, body=body)
    return result


async def expert_unload(*, model_id: str, layer: int, expert: int) -> dict[str, Any]:
    result, _ = await worker_call("moe/expert_unload", {"model_id": model_id, "layer": layer, "expert": expert})
    return result


async def gate_unload(*, model_id: str, layer: int) -> dict[str, Any]:
    result, _ = await worker_call("moe/gate_unload", {"model_id": model_id, "layer": layer})
    return result


async def expert_status() -> dict[str, Any]:
    result, _ = await worker_call("moe/expert_status", {})
    return result


def _rows_params(model_id: str, layer: int, hidden: np.ndarray) -> dict[str, Any]:
    return {"model_id": model_id, "layer": layer, "tokens": int(hidden.shape[0]), "d_model": int(hidden.shape[1])}


async def route(*, model_id: str, layer: int, hidden: np.ndarray) -> dict[str, Any]:
    """Routing of each token: [{token_index, experts: [{layer, expert, weight}]}] plus the raw arrays."""
    result, _ = await worker_call("moe/route", _rows_params(model_id, layer, hidden), body=rows_to_bytes(hidden))
    routings = [
        {"token_index": t, "experts": [{"layer": layer, "expert": e, "weight": w} for e, w in zip(es, ws, strict=True)]}
        for t, (es, ws) in enumerate(zip(result["experts"], result["weights"], strict=True))
    ]
    return {"tokens": int(hidden.shape[0]), "routings": routings}


async def execute(*, model_id: str, layer: int, expert: int, hidden: np.ndarray) -> np.ndarray:
    params = {**_rows_params(model_id, layer, hidden), "expert": expert}
    result, body = await worker_call("moe/execute", params, body=rows_to_bytes(hidden))
    return rows_from_bytes(body, d_model=result["d_model"])


async def forward(*, model_id: str, layer: int, hidden: np.ndarray) -> np.ndarray:
    result, body = await worker_call("moe/forward_local", _rows_params(model_id, layer, hidden),
                                     body=rows_to_bytes(hidden))
    return rows_from_bytes(body, d_model=result["d_model"])
