"""JSON-RPC/REST methods of the gossip view: the providers, the shard map, the dispatch planner, gossip status."""

import time
from typing import Any, Literal

from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import DB_INT_MAX, Int, Out, Params, QueryParams
from apps.providers import selectors
from core.errors import InvalidInput
from core.shardmap.planner import plan_dispatch
from core.shardmap.routings import PlanInputError

_MODEL_ID = {"min_length": 1, "max_length": 200}


class ShardMapParams(QueryParams):
    model_id: str = Field(**_MODEL_ID)


class ExpertRef(Params):
    layer: Int = Field(ge=0, le=DB_INT_MAX)
    expert: Int = Field(ge=0, le=DB_INT_MAX)


class Routing(Params):
    token_index: Int = Field(ge=0, le=DB_INT_MAX)
    experts: list[ExpertRef] = Field(max_length=256, json_schema_extra={"uniqueItems": True})


class PlanParams(Params):
    model_id: str = Field(**_MODEL_ID)
    routings: list[Routing] = Field(max_length=65536)
    allow_cold: bool = False


class LayerExpert(Out):
    layer: int
    expert: int


class PolicyShare(Out):
    min_replication: int
    max_replication: int
    hot_threshold_tps: float


class Holder(Out):
    provider: str
    residency: Literal["Warm", "Cold"]
    committed_tps: int = Field(description="Demand: rows it served for the expert per wall second, last minute.")
    capacity_tps: int = Field(description="Capacity: rows per second of expert compute it measured.")
    quic_endpoint: str | None
    quic_cert_sha256: str | None
    http_endpoint: str | None
    blob_uri: str | None
    reputation: float = Field(description="Its score as this node sees it (tenzro_moeReputation).")
    announced: bool = Field(description="False for this node's own holdings while it does not announce them.")


class Unannounced(Out):
    provider: str
    reason: str
    experts: int


class ExpertHolders(Out):
    layer: int
    expert: int
    replication: int
    holders: list[Holder]


class ShardMapOut(Out):
    model_id: str
    covered_experts: int
    distinct_providers: int
    expert_holders_role_count: int
    router_role_count: int
    policy: PolicyShare
    under_replicated_experts: list[LayerExpert]
    hot_experts: list[LayerExpert]
    expected_experts: int | None = Field(description="Experts the model has (routed and shared, every MoE "
                                                     "layer) when its shape is known; null otherwise.")
    uncovered_experts: list[LayerExpert] = Field(description="The model's experts nobody holds (shape known).")
    holders: list[ExpertHolders]
    unannounced: Unannounced | None = Field(description="Set while this node holds experts of the model it "
                                                        "does not announce, and why.")


class BatchOut(Out):
    layer: int
    expert: int
    provider: str
    quic_endpoint: str | None
    quic_cert_sha256: str | None
    http_endpoint: str | None
    token_indices: list[int]
    backups: list[str]


class Slot(Out):
    layer: int
    expert: int
    provider: str


class TokenAssignment(Out):
    token_index: int
    slots: list[Slot]


class Unroutable(Out):
    token_index: int
    layer: int
    expert: int
    reason: str


class PlanOut(Out):
    batches: list[BatchOut]
    token_assignments: list[TokenAssignment]
    unroutable: list[Unroutable]


class Announced(Out):
    seq: int
    issued_at_ms: int
    roles: list[str]
    http_endpoint: str | None
    quic_endpoint: str | None
    holdings: int
    moe_gpu: bool
    price_per_input_token: str


class ReachabilityOut(Out):
    http: bool
    quic: bool
    checked_by: str
    checked_at: str | None
    detail: str


class GossipStatusOut(Out):
    provider_id: str
    known_providers: int
    record: Announced | None
    reachability: ReachabilityOut | None
    not_announced_as_holder: str | None = Field(description="Why this node announces no holdings, if it does not.")
    verdicts: dict[str, int] = Field(description="Records and heartbeats by verdict: accepted, forged, replayed, …")


@rpc_method("tenzro_moeShardMap", rest="/moe/shard-map", http_method="GET", tag="network", params=ShardMapParams,
            response=ShardMapOut, errors=(404,))
def shard_map(params: ShardMapParams) -> dict[str, Any]:
    """Network-wide coverage of a model: replication per expert, hot, under-replicated and uncovered experts."""
    return selectors.shard_map_view(params.model_id)


@rpc_method("tenzro_moePlanDispatch", rest="/moe/plan-dispatch", tag="network", params=PlanParams,
            response=PlanOut, errors=(404,))
def plan(params: PlanParams) -> dict[str, Any]:
    """Per-holder batches the planner would dispatch for top-k routing decisions (over the view the shard map
    shows: this node's own holdings count even before it announces them, as in its forwards)."""
    routings = [{"token_index": r.token_index, "experts": [{"layer": e.layer, "expert": e.expert}
                                                              for e in r.experts]} for r in params.routings]
    try:
        return plan_dispatch(routings, selectors.shard_index_seen(params.model_id)[0], allow_cold=params.allow_cold)
    except PlanInputError as exc:  # a token listed twice, or one expert twice for a token: no schema says it
        raise InvalidInput(str(exc), reason="invalid_routings") from exc


@rpc_method("tenzro_gossipStatus", rest="/network/gossip", http_method="GET", tag="network",
            response=GossipStatusOut, errors=(404,))
def gossip_status() -> dict[str, Any]:
    """What this node announces to the network, why not more, and what its gossip refused."""
    return selectors.gossip_status()


class ProviderOut(Out):
    provider_id: str
    name: str = Field(description="The name its record carries (\"\" when none): for people, not an identity.")
    is_self: bool
    roles: list[str]
    http_endpoint: str | None
    quic_endpoint: str | None
    moe_gpu: bool
    alive_ms: int = Field(description="Its newest signed liveness (heartbeat, else record issue time), Unix ms.")
    age_s: float = Field(description="Seconds since alive_ms, on this node's clock.")
    liveness: Literal["alive", "suspect", "dead"] = Field(
        description="alive: heard from within two heartbeat intervals; dead: silent for TENZRO_GOSSIP_TTL_S.")
    latency_ms: float | None
    wire_ns_per_byte: float | None = Field(
        description="Its large answers' time beyond the round trip and its compute, per byte, as this node "
                    "measured it (ns), halved every TENZRO_FORWARD_WIRE_HALF_LIFE_S since; the planner "
                    "weighs a holder's rows by it.")
    holdings_count: int
    reputation: float


class ProvidersOut(Out):
    providers: list[ProviderOut]


@rpc_method("tenzro_networkProviders", rest="/network/providers", http_method="GET", tag="network",
            response=ProvidersOut)
def network_providers() -> dict[str, Any]:
    """The providers in this node's gossip view, this node first: name, roles, endpoints, liveness,
    holdings and reputation."""
    rows = selectors.provider_rows(now_ms=int(time.time() * 1000))
    return {"providers": [{k: v for k, v in row.items() if k != "seq"} for row in rows]}
