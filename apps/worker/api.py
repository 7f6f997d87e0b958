"""JSON-RPC/REST methods of the expert-host runtime (the runtime calls of docs/specification.md, "Expert runtime").

The runtime lives in the expert worker. Methods that act go there over the operator door
(apps/worker/client.py) with raw bytes; `tenzro_moeExpertStatus` reads what the worker last
published to the control plane, so it answers even while the worker is down (marked stale).
"""

from typing import Any, Literal

from asgiref.sync import sync_to_async
from ninja import Field
from pydantic import ConfigDict

from apps.api.b64 import b64_decode, b64_encode, base64_field
from apps.api.registry import rpc_method
from apps.api.schemas import DB_INT_MAX, Int, Out, Params, QueryParams, Unloaded, absent_or, exactly_one_of
from apps.node.selectors import redis_check
from apps.worker import client, selectors
from core.errors import InvalidInput

_MODEL_ID = {"min_length": 1, "max_length": 200}
_BLOB_URI = r"^tenzro://blob/[0-9a-f]{64}$"
_SOURCES = ("payload", "path", "blob_uri")


class PayloadSource(Params):
    """Where a payload comes from: exactly one of these three."""

    model_config = ConfigDict(json_schema_extra=exactly_one_of(*_SOURCES))

    payload: str = absent_or(json_schema_extra=base64_field("The payload (safetensors), base64."))
    path: str = absent_or(min_length=1, max_length=4096, description="A regular file on the node's filesystem.")
    blob_uri: str = absent_or(pattern=_BLOB_URI, description="tenzro://blob/<hash> to fetch, verify and load.")


class ExpertLoadParams(PayloadSource):
    model_id: str = absent_or(**_MODEL_ID, description="If given, the payload must carry this model_id.")
    layer: Int = absent_or(ge=0, le=DB_INT_MAX, description="If given, the payload must carry this layer.")
    expert: Int = absent_or(ge=0, le=DB_INT_MAX, description="If given, the payload must carry this expert.")


class GateLoadParams(PayloadSource):
    model_id: str = absent_or(**_MODEL_ID, description="Names the model when the payload does not; else must match.")
    layer: Int = absent_or(ge=0, le=DB_INT_MAX, description="Names the layer if the payload does not; else must match.")


class ExpertKey(Params):
    model_id: str = Field(**_MODEL_ID)
    layer: Int = Field(ge=0, le=DB_INT_MAX)
    expert: Int = Field(ge=0, le=DB_INT_MAX)


class GateKey(Params):
    model_id: str = Field(**_MODEL_ID)
    layer: Int = Field(ge=0, le=DB_INT_MAX)


class HiddenParams(Params):
    model_id: str = Field(**_MODEL_ID)
    layer: Int = Field(0, ge=0, le=DB_INT_MAX)
    d_model: Int = Field(gt=0, le=1 << 20)
    hidden: str = Field(json_schema_extra=base64_field(
        "Little-endian f32 [tokens, d_model], base64; its length must be whole rows of d_model."))


class ExecuteParams(HiddenParams):
    expert: Int = Field(ge=0, le=DB_INT_MAX)


class ExpertStatusParams(QueryParams):
    live: bool = Field(False, description="Ask the expert worker now (503 if it is down) instead of reading "
                                          "what it last published to the control plane.")


class ExpertRow(Out):
    model_id: str
    layer: int
    expert: int
    tier: Literal["memory", "disk"]
    residency: Literal["Warm", "Cold"]
    memory_bytes: int
    disk_bytes: int
    d_model: int
    d_ff: int
    formats: dict[str, str]
    blob_uri: str | None
    committed_tps: int = Field(0, description="Demand: rows this node served for the expert per wall second "
                                              "over the last minute.")


class GateRow(Out):
    model_id: str
    layer: int
    router: Literal["softmax", "sigmoid", "dense"]
    n_routed: int
    n_shared_experts: int
    top_k: int
    d_model: int
    memory_bytes: int
    blob_uri: str | None


class Counts(Out):
    warm: int
    cold: int
    gates: int


class BackendCandidate(Out):
    name: str = Field(description="`cuda`, `wgsl` or `cpu`.")
    available: bool | None = Field(description="None when it was not probed (another was forced or found first).")
    active: bool
    reason: str = Field(description="Why it is or is not the active backend.")


class DeviceCounts(Out):
    uploads: int
    evictions: int
    device_rows: int
    cpu_rows: int = Field(description="Rows run on the CPU by this backend: fallbacks, experts over the budget.")
    too_large: int
    cpu_format: int = Field(description="Requests run on the CPU because the device kernels do not compute the "
                                        "expert (MXFP4 blocks, biases or gpt-oss's clamped SwiGLU).")
    device_errors: int
    upload_ms: int


class DeviceTier(Out):
    kind: str
    name: str
    software: bool = Field(description="A CPU-emulated adapter (lavapipe): only ever used when forced.")
    state: str = Field(description="`ok`, or `failed` after a fatal device error (every expert then runs on the CPU).")
    failed: str | None
    memory_total_bytes: int | None
    memory_budget_bytes: int
    memory_used_bytes: int
    experts: int = Field(description="Experts resident on the device.")
    last_error: str | None
    counts: DeviceCounts


class Compute(Out):
    candidates: list[BackendCandidate]
    device: DeviceTier | None


class ExpertStatusOut(Out):
    experts: list[ExpertRow]
    gates: list[GateRow]
    memory_budget_bytes: int
    memory_used_bytes: int
    counts: Counts
    committed_tps: int = Field(description="Demand: rows served per wall second over the last minute, all experts.")
    capacity_tps: int = Field(description="Capacity: rows per second of expert compute over the last minute.")
    gpu_backend_active: bool
    backend: str | None
    cpu_kernel: str | None
    compute: Compute = Field(description="How the compute backend was chosen and the GPU device tier, if any.")
    stale: bool = Field(description="True when the worker has not reported for TENZRO_WORKER_STALE_S or stopped.")
    published_at: str | None
    heartbeat_age_s: float | None
    worker_pid: int | None
    degraded: list[str] = Field(description="What the node lacks now: `redis` (its broker and mailboxes do "
                                            "not answer), `worker` (the published state is stale).")


class RouteSlot(Out):
    layer: int
    expert: int
    weight: float


class TokenRouting(Out):
    token_index: int
    experts: list[RouteSlot]


class RouteOut(Out):
    tokens: int
    routings: list[TokenRouting]


class RowsOut(Out):
    tokens: int
    d_model: int
    output: str = Field(json_schema_extra=base64_field("Little-endian f32 [tokens, d_model], base64."))


class WorkerStatusOut(Out):
    provider_id: str
    quic_cert_sha256: str
    roles: list[str]
    version: str
    uptime_s: float
    pid: int
    calls: dict[str, int] = Field(description="Worker calls per door: calls, forbidden, errors, dropped_past_deadline, "
                                              "computed_inline.")
    degraded: list[str] = Field(description="What the worker cannot reach now: `redis` while its operator door "
                                            "cannot read its Redis mailbox.")


class RedisCheck(Out):
    ok: bool
    error: str | None


class WorkerCheck(Out):
    ok: bool
    heartbeat_age_s: float | None
    pid: int | None


class CeleryCheck(Out):
    heartbeat_age_s: float | None


class HealthChecks(Out):
    redis: RedisCheck
    worker: WorkerCheck
    celery: CeleryCheck


class NodeHealthOut(Out):
    status: Literal["ok", "degraded"]
    degraded: list[str] = Field(description="`redis`: Redis does not answer; `worker`: its published state is stale.")
    checks: HealthChecks


def _source(params: PayloadSource, what: str) -> dict[str, Any]:
    given = [name for name in _SOURCES if getattr(params, name) is not None]
    if len(given) != 1:
        raise InvalidInput(f"give exactly one of payload, path, blob_uri for the {what} (got {given or 'none'})")
    if params.payload is not None:
        payload = b64_decode(params.payload, what=f"{what} payload")
        if not payload:
            raise InvalidInput(f"the {what} payload is empty; a safetensors file was expected",
                               reason="invalid_payload")
        return {"payload": payload}
    return {"path": params.path} if params.path is not None else {"blob_uri": params.blob_uri}


def rows_out(result: dict[str, Any], body: bytes) -> dict[str, Any]:
    return {"tokens": result["tokens"], "d_model": result["d_model"], "output": b64_encode(body)}


@rpc_method("tenzro_moeExpertLoad", rest="/moe/experts/load", tag="moe", params=ExpertLoadParams,
            response=ExpertRow, errors=(404, 503), operator_only=True,
            links={"unload": {"operationId": "tenzro_moeExpertUnload", "requestBody": {
                name: f"$response.body#/{name}" for name in ("model_id", "layer", "expert")}}})
async def expert_load(params: ExpertLoadParams) -> dict[str, Any]:
    """Load one expert FFN (safetensors payload) into the runtime."""
    expect = {"model_id": params.model_id, "layer": params.layer, "expert": params.expert}
    return await client.expert_load(source=_source(params, "expert"), expect=expect)


@rpc_method("tenzro_moeGateLoad", rest="/moe/gates/load", tag="moe", params=GateLoadParams, response=GateRow,
            errors=(404, 503), operator_only=True,
            links={"unload": {"operationId": "tenzro_moeGateUnload", "requestBody": {
                name: f"$response.body#/{name}" for name in ("model_id", "layer")}}})
async def gate_load(params: GateLoadParams) -> dict[str, Any]:
    """Load a layer's gating network (safetensors payload)."""
    expect = {"model_id": params.model_id, "layer": params.layer}
    return await client.gate_load(source=_source(params, "gate"), expect=expect)


@rpc_method("tenzro_moeExpertUnload", rest="/moe/experts/unload", tag="moe", params=ExpertKey, response=Unloaded,
            errors=(404, 503), operator_only=True)
async def expert_unload(params: ExpertKey) -> dict[str, Any]:
    """Forget an expert (memory and disk tier)."""
    return await client.expert_unload(model_id=params.model_id, layer=params.layer, expert=params.expert)


@rpc_method("tenzro_moeGateUnload", rest="/moe/gates/unload", tag="moe", params=GateKey, response=Unloaded,
            errors=(404, 503), operator_only=True)
async def gate_unload(params: GateKey) -> dict[str, Any]:
    """Forget a layer's gate."""
    return await client.gate_unload(model_id=params.model_id, layer=params.layer)


@rpc_method("tenzro_moeExpertStatus", rest="/moe/status", http_method="GET", tag="moe",
            params=ExpertStatusParams, response=ExpertStatusOut, errors=(503,))
async def expert_status(params: ExpertStatusParams) -> dict[str, Any]:
    """Held experts and gates: tier, bytes, memory budget, counts, compute backend.

    By default as the worker last published them (answers while the worker is down, with
    `stale`); `live` asks the worker itself."""
    if params.live:
        return await client.expert_status_live()
    return await sync_to_async(_published_status)()


def _published_status() -> dict[str, Any]:
    published = selectors.worker_status_published()
    return {**published, "degraded": selectors.degraded(published=published, redis=redis_check())}


@rpc_method("tenzro_moeRoute", rest="/moe/route", tag="moe", params=HiddenParams, response=RouteOut,
            errors=(404, 503))
async def route(params: HiddenParams) -> dict[str, Any]:
    """Gate a batch of hidden states: top-k experts and weights per token."""
    rows = b64_decode(params.hidden, what="hidden")
    return await client.route(model_id=params.model_id, layer=params.layer, d_model=params.d_model, rows=rows)


@rpc_method("tenzro_moeExecute", rest="/moe/execute", tag="moe", params=ExecuteParams, response=RowsOut,
            errors=(404, 503))
async def execute(params: ExecuteParams) -> dict[str, Any]:
    """Run a batch of rows through one resident expert."""
    rows = b64_decode(params.hidden, what="hidden")
    return rows_out(*await client.execute(model_id=params.model_id, layer=params.layer, expert=params.expert,
                                       d_model=params.d_model, rows=rows))


@rpc_method("tenzro_workerStatus", rest="/node/worker", http_method="GET", tag="node", response=WorkerStatusOut,
            errors=(503,))
async def worker_status() -> dict[str, Any]:
    """Ask the expert worker for its `moe/status` right now (liveness), over the operator door."""
    return await client.worker_status()


@rpc_method("tenzro_nodeHealth", rest="/node/health", http_method="GET", tag="node", response=NodeHealthOut)
def node_health() -> dict[str, Any]:
    """ok, or degraded with what the node lacks (Redis, a live worker), from the control plane alone:
    it answers while Redis or the worker is down."""
    return selectors.node_health()
