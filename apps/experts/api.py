"""JSON-RPC/REST methods of the expert-host runtime (seed 000's tenzro_moe* runtime calls).

The runtime lives in the expert worker; these methods decode the JSON edge (base64
payloads and hidden rows), then call the worker over the Channels layer with raw bytes.
"""

from typing import Any

from ninja import Field, Schema

from apps.api.errors import InvalidInput
from apps.api.registry import rpc_method
from apps.experts import services
from apps.experts.wire import payload_from_b64, rows_from_bytes, rows_to_b64


class ExpertLoadParams(Schema):
    payload: str | None = Field(None, description="Expert payload (safetensors), base64.")
    path: str | None = Field(None, description="Expert payload file on the node's filesystem.")
    blob_uri: str | None = Field(None, description="tenzro://blob/<hash> to fetch and load.")
    model_id: str | None = Field(None, description="If given, must match the payload's model_id.")
    layer: int | None = Field(None, ge=0)
    expert: int | None = Field(None, ge=0)


class GateLoadParams(Schema):
    payload: str | None = None
    path: str | None = None
    blob_uri: str | None = None
    model_id: str | None = None
    layer: int | None = Field(None, ge=0)


class ExpertKey(Schema):
    model_id: str
    layer: int = Field(ge=0)
    expert: int = Field(ge=0)


class GateKey(Schema):
    model_id: str
    layer: int = Field(ge=0)


class HiddenParams(Schema):
    model_id: str
    layer: int = Field(0, ge=0)
    d_model: int = Field(gt=0)
    hidden: str = Field(description="Little-endian f32 [tokens, d_model], base64.")


class ExecuteParams(HiddenParams):
    expert: int = Field(ge=0)


def _source(params: ExpertLoadParams | GateLoadParams, what: str) -> dict[str, Any]:
    given = [name for name in ("payload", "path", "blob_uri") if getattr(params, name)]
    if len(given) != 1:
        raise InvalidInput(f"give exactly one of payload, path, blob_uri for the {what} (got {given or 'none'})")
    if params.payload:
        try:
            return {"payload": payload_from_b64(params.payload, what=f"{what} payload")}
        except ValueError as exc:
            raise InvalidInput(str(exc)) from exc
    return {"path": params.path} if params.path else {"blob_uri": params.blob_uri}


def _hidden(params: HiddenParams) -> Any:
    try:
        data = payload_from_b64(params.hidden, what="hidden")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    try:
        return rows_from_bytes(data, d_model=params.d_model)
    except ValueError as exc:
        raise InvalidInput(str(exc), reason="shape_mismatch") from exc


@rpc_method("tenzro_moeExpertLoad", rest="/moe/experts/load", tag="moe", params=ExpertLoadParams,
            operator_only=True)
async def expert_load(params: ExpertLoadParams) -> dict[str, Any]:
    """Load one expert FFN (safetensors payload) into the runtime."""
    expect = {"model_id": params.model_id, "layer": params.layer, "expert": params.expert}
    return await services.expert_load(source=_source(params, "expert"), expect=expect)


@rpc_method("tenzro_moeGateLoad", rest="/moe/gates/load", tag="moe", params=GateLoadParams, operator_only=True)
async def gate_load(params: GateLoadParams) -> dict[str, Any]:
    """Load a layer's gating network (safetensors payload)."""
    expect = {"model_id": params.model_id, "layer": params.layer}
    return await services.gate_load(source=_source(params, "gate"), expect=expect)


@rpc_method("tenzro_moeExpertUnload", rest="/moe/experts/unload", tag="moe", params=ExpertKey, operator_only=True)
async def expert_unload(params: ExpertKey) -> dict[str, Any]:
    """Forget an expert (memory and disk tier)."""
    return await services.expert_unload(model_id=params.model_id, layer=params.layer, expert=params.expert)


@rpc_method("tenzro_moeGateUnload", rest="/moe/gates/unload", tag="moe", params=GateKey, operator_only=True)
async def gate_unload(params: GateKey) -> dict[str, Any]:
    """Forget a layer's gate."""
    return await services.gate_unload(model_id=params.model_id, layer=params.layer)


@rpc_method("tenzro_moeExpertStatus", rest="/moe/status", http_method="GET", tag="moe")
async def expert_status() -> dict[str, Any]:
    """Resident experts and gates: tier, bytes, memory budget, counts, compute backend."""
    return await services.expert_status()


@rpc_method("tenzro_moeRoute", rest="/moe/route", tag="moe", params=HiddenParams)
async def route(params: HiddenParams) -> dict[str, Any]:
    """Gate a batch of hidden states: top-k experts and weights per token."""
    return await services.route(model_id=params.model_id, layer=params.layer, hidden=_hidden(params))


@rpc_method("tenzro_moeExecute", rest="/moe/execute", tag="moe", params=ExecuteParams)
async def execute(params: ExecuteParams) -> dict[str, Any]:
    """Run a batch of rows through one resident expert."""
    out = await services.execute(model_id=params.model_id, layer=params.layer, expert=params.expert,
                                 hidden=_hidden(params))
    return {"tokens": int(out.shape[0]), "d_model": int(out.shape[1]), "output": rows_to_b64(out)}


@rpc_method("tenzro_moeForward", rest="/moe/forward", tag="moe", params=HiddenParams)
async def forward(params: HiddenParams) -> dict[str, Any]:
    """Layer forward: gate → execute the selected experts → gate-weighted combine."""
    out = await services.forward(model_id=params.model_id, layer=params.layer, hidden=_hidden(params))
    return {"tokens": int(out.shape[0]), "d_model": int(out.shape[1]), "output": rows_to_b64(out)}
