"""JSON-RPC/REST of repair: `tenzro_moeRepairPasses` (read), `tenzro_moeRepairRun` (operator)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import Out, QueryParams
from apps.repair import selectors, services


class PassesParams(QueryParams):
    limit: int = Field(20, ge=0, le=500, description="How many of the most recent passes.")


class RepairRowOut(Out):
    model_id: str
    layer: int
    expert: int
    action: str = Field(description="add | drop")
    rank: int = Field(description="Position in the expert's rendezvous order.")
    holders: int
    target: int
    blob_uri: str | None
    outcome: str = Field(description="fetched | deferred | skipped | drop_pending | dropped")
    why: str | None = None
    bytes: int | None = None
    tier: str | None = None


class PassOut(Out):
    id: int
    started_at: datetime
    finished_at: datetime | None
    duration_ms: float | None
    trigger: str = Field(description="schedule | operator")
    interval_s: int
    max_admissions: int
    model_ids: list[str]
    considered: int
    rows: list[RepairRowOut] = Field(description="The rows naming this node, and what became of each.")
    fetched: int
    dropped: int
    unrepairable: list[list[str | int]] = Field(description="[model_id, layer, expert, reason], at most 100.")
    unrepairable_count: int
    capped: list[list[str | int]] = Field(description=(
        "[model_id, layer, expert, target, reachable]: hot experts whose demand asks for more holders than "
        "there are providers to hold them (they have at least min_replication), at most 100."))
    capped_count: int
    error: str


class PassesOut(Out):
    next_due_at: datetime | None = Field(description="When the next scheduled pass is due (the active policy's "
                                                     "interval x this node's jitter).")
    passes: list[PassOut]


class RunOut(Out):
    queued: bool


@rpc_method("tenzro_moeRepairPasses", rest="/moe/repair/passes", http_method="GET", tag="moe", params=PassesParams,
            response=PassesOut)
def repair_passes(params: PassesParams) -> dict[str, Any]:
    """Recent repair passes: what each considered, chose, fetched, skipped and why."""
    return {"next_due_at": services.repair_next_due(), "passes": selectors.repair_passes(limit=params.limit)}


@rpc_method("tenzro_moeRepairRun", rest="/moe/repair/run", tag="moe", response=RunOut, operator_only=True)
def repair_run() -> dict[str, Any]:
    """Queue a repair pass now, whatever the schedule (it runs in the Celery worker)."""
    services.repair_run_enqueue()
    return {"queued": True}
