"""JSON-RPC 2.0 conformance of POST /rpc (jsonrpc.org/specification, section by section)."""

import json

import pytest
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db

TOKEN = "test-operator-token"


def rpc(client: Client, payload, *, token: str | None = None, raw: bytes | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    body = raw if raw is not None else json.dumps(payload)
    return client.post("/rpc", data=body, content_type="application/json", **headers)


def test_call_returns_result_with_same_id(client) -> None:
    answer = rpc(client, {"jsonrpc": "2.0", "id": "abc", "method": "tenzro_nodeInfo"}).json()
    assert answer["id"] == "abc" and answer["jsonrpc"] == "2.0" and "error" not in answer
    assert len(answer["result"]["provider_id"]) == 64
    assert set(answer["result"]["endpoints"]) == {"http", "quic", "quic_cert_sha256"}


def test_parse_error(client) -> None:
    answer = rpc(client, None, raw=b'{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]').json()
    assert answer["error"]["code"] == -32700
    assert answer["id"] is None


@pytest.mark.parametrize(
    "call",
    [
        {"jsonrpc": "2.0", "method": 1, "params": "bar"},
        {"jsonrpc": "1.0", "id": 1, "method": "tenzro_nodeInfo"},
        {"id": 1, "method": "tenzro_nodeInfo"},
        {"jsonrpc": "2.0", "id": 1, "method": "tenzro_nodeInfo", "params": "positional?"},
        {"jsonrpc": "2.0", "id": {"no": "objects"}, "method": "tenzro_nodeInfo"},
        1,
    ],
)
def test_invalid_request(client, call) -> None:
    answer = rpc(client, call).json()
    assert answer["error"]["code"] == -32600
    assert answer["error"]["message"].startswith("Invalid Request")


def test_empty_batch_is_one_invalid_request(client) -> None:
    answer = rpc(client, []).json()
    assert answer["error"]["code"] == -32600 and answer["id"] is None


def test_unknown_method(client) -> None:
    answer = rpc(client, {"jsonrpc": "2.0", "id": 7, "method": "tenzro_noSuchThing"}).json()
    assert answer == {"jsonrpc": "2.0", "id": 7,
                      "error": {"code": -32601, "message": "Method not found: tenzro_noSuchThing",
                                "data": {"reason": "method_not_found"}}}


def test_invalid_params_name_the_field(client) -> None:
    call = {"jsonrpc": "2.0", "id": 3, "method": "tenzro_policyHistory", "params": {"limit": "many"}}
    error = rpc(client, call).json()["error"]
    assert error["code"] == -32602
    assert error["data"]["reason"] == "invalid_params"
    assert error["data"]["errors"][0]["loc"] == ["limit"]
    # the message itself names the field and why, for a person reading one line (the CLI prints it)
    assert error["message"].startswith("Invalid params for tenzro_policyHistory: limit: Input should be a valid")


def test_params_by_position(client) -> None:
    call = {"jsonrpc": "2.0", "id": 3, "method": "tenzro_policyHistory", "params": [1]}
    assert len(rpc(client, call).json()["result"]["policies"]) == 1


def test_params_to_a_method_without_params(client) -> None:
    call = {"jsonrpc": "2.0", "id": 3, "method": "tenzro_nodeInfo", "params": {"x": 1}}
    assert rpc(client, call).json()["error"]["code"] == -32602


def test_notification_gets_no_response(client) -> None:
    response = rpc(client, {"jsonrpc": "2.0", "method": "tenzro_nodeInfo"})
    assert response.status_code == 204 and response.content == b""


def test_batch_with_mixed_results_keeps_order_and_skips_notifications(client) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": "1", "method": "tenzro_nodeInfo"},
        {"jsonrpc": "2.0", "method": "tenzro_nodeInfo"},
        {"jsonrpc": "2.0", "id": "2", "method": "nope"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "id": "3", "method": "tenzro_policyGet"},
        {"jsonrpc": "2.0", "id": "4", "method": "tenzro_policyPropose", "params": {"changes": {}}},
    ]
    answers = rpc(client, batch).json()
    assert [a["id"] for a in answers] == ["1", "2", None, "3", "4"]
    assert "result" in answers[0]
    assert answers[1]["error"]["code"] == -32601
    assert answers[2]["error"]["code"] == -32600
    assert answers[3]["result"]["min_replication"] == 2
    assert answers[4]["error"]["data"]["reason"] == "unauthorized"


def test_batch_of_only_notifications_answers_nothing(client) -> None:
    batch = [{"jsonrpc": "2.0", "method": "tenzro_nodeInfo"}, {"jsonrpc": "2.0", "method": "tenzro_policyGet"}]
    assert rpc(client, batch).status_code == 204


def test_mutating_method_refused_without_or_with_wrong_token(client) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tenzro_policyPropose", "params": {"changes": {"min_replication": 3}}}
    for token, said in ((None, "missing"), ("wrong-token", "not_accepted")):
        error = rpc(client, call, token=token).json()["error"]
        assert error["code"] == -32001 and error["data"] == {"reason": "unauthorized", "token": said}
    # a token that is not this node's is told apart from none, with where the CLI reads it
    assert "needs the operator token" in rpc(client, call).json()["error"]["message"]
    message = rpc(client, call, token="wrong-token").json()["error"]["message"]
    assert "not accepted" in message and "TENZRO_DATA_DIR" in message
    assert rpc(client, call, token=TOKEN).json()["result"]["status"] == "proposed"


def test_application_error_carries_reason(client) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tenzro_policyApprove", "params": {"policy_id": 999}}
    error = rpc(client, call, token=TOKEN).json()["error"]
    assert error["code"] == -32004 and error["data"]["reason"] == "policy_not_found"


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000, TENZRO_RPC_MAX_BYTES=1000)
def test_oversized_payload_is_refused(client) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tenzro_nodeInfo", "params": {"pad": "x" * 5000}}
    response = rpc(client, call)
    assert response.status_code == 413
    assert response.json()["error"]["data"] == {"reason": "payload_too_large", "limit_bytes": 1000,
                                                "setting": "TENZRO_RPC_MAX_BYTES"}


def test_get_is_not_allowed(client) -> None:
    assert client.get("/rpc").status_code == 405
