"""The registry's result contract: what leaves either edge matches the method's response schema."""

import asyncio
import json

import pytest
from pydantic import ValidationError

from apps.api.registry import ResponseContractError, RpcMethod
from apps.api.schemas import Int, Out, Params


class Weights(Out):
    weight: float
    note: str | None = None


class Numbers(Params):
    count: Int


def _method(func, params=None) -> RpcMethod:
    return RpcMethod(name="tenzro_test", func=func, params=params, response=Weights, errors=(), operator_only=False,
                     rest_path="/test", http_method="POST", tag="test", summary="", description="")


def test_results_are_reduced_to_the_schema_and_non_finite_floats_are_a_contract_break() -> None:
    assert asyncio.run(_method(lambda: {"weight": 0.5, "extra": 1}).invoke(None)) == {"weight": 0.5, "note": None}
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ResponseContractError, match="tenzro_test"):
            asyncio.run(_method(lambda bad=bad: {"weight": bad}).invoke(None))


@pytest.mark.parametrize("value", [True, "3", 3.5, None])
def test_body_params_take_exactly_their_json_type(value) -> None:
    with pytest.raises(ValidationError):
        Numbers.model_validate({"count": value})
    assert Numbers.model_validate({"count": 3.0}).count == 3  # JSON Schema counts 3.0 as an integer
    with pytest.raises(ValidationError):
        Numbers.model_validate([None, None])


@pytest.mark.django_db
def test_nan_in_a_request_is_a_parse_error(client) -> None:
    answer = client.post("/rpc", data='{"jsonrpc": "2.0", "id": NaN, "method": "tenzro_nodeInfo"}',
                         content_type="application/json").json()
    assert answer["error"]["code"] == -32700 and "NaN" in answer["error"]["message"]
    assert json.loads(client.post("/rpc", data='{"jsonrpc": "2.0", "id": 1, "method": "tenzro_nodeInfo"}',
                                  content_type="application/json").content)["result"]["provider_id"]
