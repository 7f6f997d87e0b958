"""Writes of the worker's published state (called from the expert worker process only).

`worker_state_publish` makes the rows equal the runtime's status snapshot: it compares with
what is stored and writes only the rows that changed, in one transaction, so a reader never
sees half a publish and a node with thousands of holdings does not rewrite them all when one
expert is evicted.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.worker.models import HeldExpert, HeldGate, Residency, WorkerState
from apps.worker.selectors import worker_status_published
from apps.worker.signals import worker_state_published

_EXPERT_FIELDS = ("residency", "memory_bytes", "disk_bytes", "d_model", "d_ff", "formats", "blob_uri")
_GATE_FIELDS = ("router", "n_routed", "n_shared_experts", "top_k", "d_model", "memory_bytes", "blob_uri")


def _expert_values(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "residency": Residency.WARM if row["tier"] == "memory" else Residency.COLD,
        "memory_bytes": row["memory_bytes"], "disk_bytes": row["disk_bytes"], "d_model": row["d_model"],
        "d_ff": row["d_ff"], "formats": row["formats"], "blob_uri": row["blob_uri"],
    }


def _gate_values(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in _GATE_FIELDS}


def _sync(model: type[HeldExpert] | type[HeldGate], key_fields: tuple[str, ...], fields: tuple[str, ...],
          wanted: dict[tuple, dict[str, Any]], now: dt.datetime) -> int:
    """Make `model`'s rows equal `wanted` ({key: values}); returns how many rows changed."""
    stored = {tuple(getattr(row, f) for f in key_fields): row for row in model.objects.all()}
    gone = [row.pk for key, row in stored.items() if key not in wanted]
    create, update = [], []
    for key, values in wanted.items():
        row = stored.get(key)
        if row is None:
            create.append(model(**dict(zip(key_fields, key, strict=True)), **values))
        elif any(getattr(row, f) != values[f] for f in fields):
            for f in fields:
                setattr(row, f, values[f])
            row.changed_at = now  # bulk_update does not run auto_now
            update.append(row)
    if gone:
        model.objects.filter(pk__in=gone).delete()
    if create:
        model.objects.bulk_create(create)
    if update:
        model.objects.bulk_update(update, [*fields, "changed_at"])
    return len(gone) + len(create) + len(update)


def _state_values(status: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    return {
        "heartbeat_at": now, "stopped_at": None,
        "memory_budget_bytes": status["memory_budget_bytes"], "memory_used_bytes": status["memory_used_bytes"],
        "committed_tps": status["committed_tps"], "capacity_tps": status["capacity_tps"],
        "demand": status["demand"], "backend": status["backend"],
        "cpu_kernel": status["cpu_kernel"] or "", "gpu_backend_active": status["gpu_backend_active"],
        "compute": status.get("compute") or {},
    }


@transaction.atomic
def worker_state_publish(*, provider_id: str, pid: int, started_at: dt.datetime, status: dict[str, Any]) -> int:
    """Publish a runtime status snapshot (ExpertRuntime.status()); returns the rows changed."""
    now = timezone.now()
    experts = {(r["model_id"], r["layer"], r["expert"]): _expert_values(r) for r in status["experts"]}
    gates = {(r["model_id"], r["layer"]): _gate_values(r) for r in status["gates"]}
    changed = _sync(HeldExpert, ("model_id", "layer", "expert"), _EXPERT_FIELDS, experts, now)
    changed += _sync(HeldGate, ("model_id", "layer"), _GATE_FIELDS, gates, now)
    WorkerState.objects.update_or_create(pk=1, defaults={
        "provider_id": provider_id, "pid": pid, "started_at": started_at, "published_at": now,
        **_state_values(status, now),
    })
    transaction.on_commit(_announce)
    return changed


def _announce() -> None:
    """After a publish or heartbeat commits: send what a reader now sees (three queries)."""
    worker_state_published.send(sender=WorkerState, status=worker_status_published())


def worker_state_heartbeat(*, pid: int, status: dict[str, Any]) -> None:
    """Refresh the node-wide figures and the liveness stamp (not the holdings)."""
    now = timezone.now()
    values = _state_values(status, now)
    WorkerState.objects.filter(pk=1, pid=pid).update(**values)
    transaction.on_commit(_announce)  # demand, capacity and memory used move between publishes


def worker_state_stopped(*, pid: int) -> None:
    """A clean shutdown: readers see the state as stale at once instead of after the TTL."""
    WorkerState.objects.filter(pk=1, pid=pid).update(stopped_at=timezone.now())
