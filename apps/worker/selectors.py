"""Reads of the worker's published state: what this node holds, without asking the worker.

A node whose worker is down still answers from the last published state; `stale` says so.
The state is stale once the worker has been silent for TENZRO_WORKER_STALE_S seconds (it
heartbeats every TENZRO_WORKER_HEARTBEAT_S), or at once after a clean shutdown.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.blobs.store import parse_blob_uri
from apps.node.selectors import node_processes, redis_check
from apps.worker.models import HeldExpert, HeldGate, Residency, WorkerState
from core.errors import Conflict

_EMPTY_STATUS = {
    "memory_budget_bytes": 0, "memory_used_bytes": 0, "committed_tps": 0, "capacity_tps": 0,
    "gpu_backend_active": False,
    "backend": None, "cpu_kernel": None, "compute": {"candidates": [], "device": None},
}


def _staleness(state: WorkerState | None, now: dt.datetime) -> tuple[bool, float | None]:
    if state is None:
        return True, None
    age = (now - state.heartbeat_at).total_seconds()
    return state.stopped_at is not None or age > settings.TENZRO_WORKER_STALE_S, round(age, 1)


def expert_row(row: HeldExpert) -> dict[str, Any]:
    return {
        "model_id": row.model_id, "layer": row.layer, "expert": row.expert,
        "tier": "memory" if row.residency == Residency.WARM else "disk", "residency": row.residency,
        "memory_bytes": row.memory_bytes, "disk_bytes": row.disk_bytes, "d_model": row.d_model, "d_ff": row.d_ff,
        "formats": row.formats, "blob_uri": row.blob_uri,
    }


def gate_row(row: HeldGate) -> dict[str, Any]:
    return {
        "model_id": row.model_id, "layer": row.layer, "router": row.router, "n_routed": row.n_routed,
        "n_shared_experts": row.n_shared_experts, "top_k": row.top_k, "d_model": row.d_model,
        "memory_bytes": row.memory_bytes, "blob_uri": row.blob_uri,
    }


def held_model_ids() -> list[str]:
    """The models this node holds experts of (one query)."""
    return list(HeldExpert.objects.order_by("model_id").values_list("model_id", flat=True).distinct())


def worker_stale() -> bool:
    """Whether the published state is stale (one query; see the module docstring)."""
    return _staleness(WorkerState.objects.filter(pk=1).first(), timezone.now())[0]


def worker_status_published() -> dict[str, Any]:
    """tenzro_moeExpertStatus from the control plane: three queries, whatever the holdings."""
    now = timezone.now()
    state = WorkerState.objects.filter(pk=1).first()
    demand = {} if state is None else expert_demand(state)
    experts = [{**expert_row(r), "committed_tps": demand.get((r.model_id, r.layer, r.expert), 0)}
               for r in HeldExpert.objects.all()]
    gates = [gate_row(r) for r in HeldGate.objects.all()]
    stale, age = _staleness(state, now)
    warm = sum(1 for e in experts if e["residency"] == Residency.WARM)
    figures = _EMPTY_STATUS if state is None else {
        "memory_budget_bytes": state.memory_budget_bytes, "memory_used_bytes": state.memory_used_bytes,
        "committed_tps": state.committed_tps, "capacity_tps": state.capacity_tps,
        "gpu_backend_active": state.gpu_backend_active,
        "backend": state.backend, "cpu_kernel": state.cpu_kernel or None,
        "compute": {"candidates": [], "device": None, **(state.compute or {})},
    }
    return {
        "experts": experts,
        "gates": gates,
        **figures,
        "counts": {"warm": warm, "cold": len(experts) - warm, "gates": len(gates)},
        "stale": stale,
        "published_at": None if state is None else state.published_at.isoformat(),
        "heartbeat_age_s": age,
        "worker_pid": None if state is None else state.pid,
    }


def holdings() -> list[dict[str, Any]]:
    """This node's `moe_holdings` as ProviderCapacity (docs/specification.md, "Provider record") lists them:
    each with its own demand (`committed_tps`) and the node's capacity (`capacity_tps`)."""
    state = WorkerState.objects.filter(pk=1).first()
    capacity = 0 if state is None else state.capacity_tps
    demand = {} if state is None else expert_demand(state)
    return [
        {"model_id": r.model_id, "layer": r.layer, "expert": r.expert, "residency": r.residency,
         "committed_tps": demand.get((r.model_id, r.layer, r.expert), 0), "capacity_tps": capacity,
         "blob_uri": r.blob_uri}
        for r in HeldExpert.objects.all()
    ]


def expert_demand(state: WorkerState) -> dict[tuple[str, int, int], int]:
    """{(model_id, layer, expert): rows/s} as the worker last metered it (experts with none are absent)."""
    return {(m, la, e): tps for m, la, e, tps in state.demand or []}


def held_blob_hashes() -> set[str]:
    """Every blob a published holding (expert or gate) names; Conflict when nothing was ever
    published, since then we cannot tell which blobs are in use."""
    if not WorkerState.objects.filter(pk=1).exists():
        raise Conflict("the expert worker has never published what it holds; start the node before "
                       "collecting blobs", reason="state_not_published")
    uris = [*HeldExpert.objects.exclude(blob_uri=None).values_list("blob_uri", flat=True),
            *HeldGate.objects.exclude(blob_uri=None).values_list("blob_uri", flat=True)]
    return {parse_blob_uri(uri) for uri in uris}


def degraded(*, published: dict[str, Any], redis: dict[str, Any]) -> list[str]:
    """What this node lacks now: `redis` (no broker, no mailboxes: the web cannot reach the
    worker, jobs cannot be queued) and `worker` (its published state is stale)."""
    return [name for name, bad in (("redis", not redis["ok"]), ("worker", published["stale"])) if bad]


def node_health() -> dict[str, Any]:
    """tenzro_nodeHealth: ok or degraded, and each check behind the verdict."""
    published = worker_status_published()
    redis = redis_check()
    processes = node_processes()
    problems = degraded(published=published, redis=redis)
    return {
        "status": "degraded" if problems else "ok",
        "degraded": problems,
        "checks": {
            "redis": redis,
            "worker": {"ok": not published["stale"], "heartbeat_age_s": published["heartbeat_age_s"],
                       "pid": published["worker_pid"]},
            # informational: beat stamps it every TENZRO_HEARTBEAT_S, and a restarted Redis has none yet
            "celery": {"heartbeat_age_s": processes["celery_heartbeat_age_s"]},
        },
    }


def gate_d_model(model_id: str, layer: int) -> int | None:
    """The hidden width of the gate this node holds for (model, layer), None when it holds none."""
    return HeldGate.objects.filter(model_id=model_id, layer=layer).values_list("d_model", flat=True).first()
