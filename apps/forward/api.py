"""JSON-RPC/REST methods of the distributed forward: `tenzro_moeForward` (run one layer's forward
in the expert worker, over the operator door) and `tenzro_moeHolderPenalties` (its records)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field

from apps.api.b64 import b64_decode
from apps.api.registry import rpc_method
from apps.api.schemas import Out, QueryParams, absent_or
from apps.forward import selectors
from apps.worker import client
from apps.worker.api import HiddenParams, RowsOut, rows_out


class PenaltiesParams(QueryParams):
    limit: int = Field(50, ge=0, le=1000, description="How many of the most recent penalties to list.")


class PenaltyRow(Out):
    provider_id: str
    reason: str
    message: str
    model_id: str
    layer: int
    expert: int
    rows: int
    at: datetime


class PenaltiesOut(Out):
    by_provider: dict[str, dict[str, int]] = Field(description="{provider_id: {reason: count}}")
    recent: list[PenaltyRow]


@rpc_method("tenzro_moeHolderPenalties", rest="/moe/penalties", http_method="GET", tag="moe",
            params=PenaltiesParams, response=PenaltiesOut)
def holder_penalties(params: PenaltiesParams) -> dict[str, Any]:
    """Holders this node's forwards saw fail (timeout, connection_failed, stalled, …), for reputation."""
    return {"by_provider": selectors.penalties_by_provider(), "recent": selectors.penalties_recent(params.limit)}


class ForwardParams(HiddenParams):
    allow_partial: bool = Field(False, description="Return a renormalized partial result when some (expert, "
                                                   "token) pairs cannot be served, instead of failing closed.")
    allow_cold: bool = Field(False, description="Plan on Cold (disk-tier) holders when no Warm one is left.")
    min_gate_mass: float = Field(0.0, ge=0.0, le=1.0, description="With allow_partial: a token that kept less "
                                 "than this share of its gate mass is an error (gate_mass_lost), not a result.")
    wire: Literal["q8_0", "f32"] = absent_or(description="Activation codec to send rows in (default: the first "
                                             "of TENZRO_ACTIVATION_CODECS each holder's record lists).")


class MissingPair(Out):
    layer: int
    expert: int
    token_index: int


class HolderForwardStats(Out):
    provider: str
    transport: Literal["local", "quic", "http", ""]
    batches: int
    rows: int
    bytes_sent: int
    bytes_received: int
    failures: int
    latency_ms_median: float | None
    latency_ms_max: float | None
    overhead_ms_median: float | None = Field(description="A request's latency minus the compute the holder "
                                                         "reported for it (median).")
    compute_ms: float | None = Field(None, description="The compute_ms its accepted batches' answers reported, "
                                                       "summed (null when none reported it).")
    rtt_ms: float | None = Field(None, description="The QUIC path's smoothed round trip as its answers found it "
                                                    "(median; null over HTTP or locally): what the planner ranks "
                                                    "it by.")
    wire_ns_per_byte: float | None = Field(None, description="Its slowest request's time beyond rtt_ms and its "
                                                             "compute, per byte sent and received (null under "
                                                             "64 KiB or without a QUIC round trip): what the "
                                                             "planner weighs its rows by.")
    receipts: int = Field(description="Its batches accepted with a verified receipt (0 for this node's own).")
    lanes: int = Field(1, description="The QUIC connections its requests were split over (more than 1 where a "
                                      "request was larger than the congestion window of a lossy path).")


class ForwardFailure(Out):
    provider: str
    reason: str
    layer: int
    expert: int
    rows: int
    message: str


class ForwardStats(Out):
    forward_id: str = Field(description="The key of this forward's settlement (tenzro_moeSettlements).")
    elapsed_ms: float
    dispatch_ms: float
    batches: int
    hedges_fired: int
    hedges_won: int
    retries: int
    replans: int
    bytes_sent: int
    bytes_received: int
    lost_gate_mass: float | None = Field(description="Sum over tokens of the share of gate mass lost.")
    codecs: list[str]
    holders: list[HolderForwardStats]
    failures: list[ForwardFailure]


class ForwardOut(RowsOut):
    missing: list[MissingPair] = Field(description="Unserved (layer, expert, token) pairs (allow_partial only).")
    lost_gate_mass: list[float] = Field(description="Per token, the share of its gate mass lost; empty when "
                                                    "nothing was.")
    stats: ForwardStats


@rpc_method("tenzro_moeForward", rest="/moe/forward", tag="moe", params=ForwardParams, response=ForwardOut,
            errors=(404, 503))
async def forward(params: ForwardParams) -> dict[str, Any]:
    """Distributed layer forward: gate here → plan over the shard map → dispatch each holder's
    batch (locally, QUIC or HTTP; failover, hedging, bounded replanning) → gate-weighted combine.

    Fails closed (`forward_incomplete`, with `missing`) unless `allow_partial`."""
    rows = b64_decode(params.hidden, what="hidden")
    options = params.model_dump(include={"allow_partial", "allow_cold", "min_gate_mass", "wire"}, exclude_none=True)
    result, body = await client.forward(model_id=params.model_id, layer=params.layer, d_model=params.d_model,
                                        rows=rows, options=options)
    return {**rows_out(result, body), "missing": result["missing"], "lost_gate_mass": result["lost_gate_mass"],
            "stats": result["stats"]}
