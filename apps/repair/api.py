"""JSON-RPC/REST of repair: `tenzro_moeRepairPasses` (read), `tenzro_moeRepairRun` and `tenzro_moePlace`
(operator)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Field
from pydantic import StringConstraints

from apps.api.registry import rpc_method
from apps.api.schemas import DB_INT_MAX, Int, Out, Params, QueryParams, absent_or
from apps.repair import placement, selectors, services

_MODEL_ID = {"min_length": 1, "max_length": 200}
_BLOB_URI = r"^tenzro://blob/[0-9a-f]{64}$"
_PROVIDER_ID = r"^[0-9a-f]{64}$"
_UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


class PassesParams(QueryParams):
    limit: int = Field(20, ge=0, le=500, description="How many of the most recent passes.")


class RepairRowOut(Out):
    model_id: str
    layer: int
    expert: int
    action: str = Field(description="add | drop | recover (an expert this node prepared that nobody holds any more)")
    rank: int | None = Field(description="Position in the expert's rendezvous order; null on a recover row.")
    holders: int
    target: int | None = Field(description="The replication the expert should have; null on a recover row.")
    blob_uri: str | None
    outcome: str = Field(description="fetched | deferred | skipped | drop_pending | dropped; on a recover row "
                                     "lost_pending | recovered | reprepare_queued | reprepare_running | deferred "
                                     "| skipped")
    why: str | None = None
    bytes: int | None = None
    tier: str | None = None
    job_id: str | None = Field(None, description="The prepare job publishing a lost expert again (recover rows).")


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
    unrepairable_why: str = Field(description="For people: each reason among the unrepairable experts, how many, "
                                              "and what it means (\"\" when none).")
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


class PlacedExpert(Params):
    model_id: str = Field(**_MODEL_ID)
    layer: Int = Field(ge=0, le=DB_INT_MAX)
    expert: Int = Field(ge=0, le=DB_INT_MAX)
    blob_uri: str = Field(pattern=_BLOB_URI)


class PlacedGate(Params):
    model_id: str = Field(**_MODEL_ID)
    layer: Int = Field(ge=0, le=DB_INT_MAX)
    blob_uri: str = Field(pattern=_BLOB_URI)


class PlaceParams(Params):
    job_ids: list[Annotated[str, StringConstraints(pattern=_UUID)]] = Field(
        [], max_length=1024, description="Finished prepare jobs of this node: their experts and gates.")
    experts: list[PlacedExpert] = Field([], max_length=65536, description="Or the experts themselves (a job "
                                                                          "another node ran).")
    gates: list[PlacedGate] = Field([], max_length=4096)
    providers: list[Annotated[str, StringConstraints(pattern=_PROVIDER_ID)]] = Field(
        [], max_length=4096, description="Provider ids to place on (this node among them); default: this "
                    "node and every ExpertHolder of its gossip view.")
    replication: Int = absent_or(ge=1, le=64, description="Holders per expert (default: the policy's "
                                                           "min_replication; at most the providers).")
    load_gates: bool = Field(True, description="Load the gates here too (this node routes the model).")


class PlaceRowOut(Out):
    model_id: str
    layer: int
    expert: int
    blob_uri: str
    provider: str
    rank: int = Field(description="Position in the expert's rendezvous order over the providers.")
    outcome: str = Field(description="loaded | held | failed | skipped (this node: skipped after "
                                     "consecutive failures), elsewhere (another provider's share)")
    why: str | None = None


class PlaceGateOut(Out):
    model_id: str
    layer: int
    blob_uri: str
    outcome: str = Field(description="loaded | held | failed")
    why: str | None = None


class PlaceIdleOut(Out):
    model_id: str
    providers: list[str]


class PlaceOut(Out):
    provider_id: str = Field(description="This node.")
    providers: list[str]
    replication: int = Field(description="Holders per expert placed: the requested one, at most the providers.")
    requested_replication: int
    rows: list[PlaceRowOut]
    gates: list[PlaceGateOut]
    idle: list[PlaceIdleOut] = Field(description=(
        "Per model, the providers this placement gives no expert of it: not repair candidates for that model "
        "until they hold part of it (docs/operations.md, \"Repair\")."))


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


@rpc_method("tenzro_moePlace", rest="/moe/place", tag="moe", params=PlaceParams, response=PlaceOut,
            operator_only=True, errors=(404,))
def place(params: PlaceParams) -> dict[str, Any]:
    """Place prepared experts by the rendezvous rule repair uses, loading this node's share (docs/protocol.md,
    "Placement"); idempotent. Run it on each node with the same providers, or `tenzro moe place --nodes`."""
    experts, gates = placement.job_pieces(params.job_ids)
    experts += [e.model_dump() for e in params.experts]
    gates += [g.model_dump() for g in params.gates]
    return placement.place(experts=experts, gates=gates, providers=params.providers or None,
                           replication=params.replication, load_gates=params.load_gates)
