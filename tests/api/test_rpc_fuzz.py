"""A hostile-input corpus against the real ASGI app, in process: JSON-RPC at /rpc and the REST routes.

Every input must get a clear error (the standard JSON-RPC code, `data.reason` naming what was
wrong; REST: 4xx with `reason`), never a 500, and the app must answer a good request after
it. Inputs that need the expert worker to judge them (rows of the wrong d_model, NaN rows)
are sent to a real node in tests/e2e/test_peer_door.py.
"""

import asyncio
import json

import pytest
from django.core.asgi import get_asgi_application
from django.test import Client

from apps.api.body_limit import BodyLimit
from apps.api.registry import REGISTRY

pytestmark = pytest.mark.django_db

TOKEN = "test-operator-token"
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


def post(path: str, body: bytes):
    # The test client runs the async views under async_to_sync, so their ORM calls share the
    # test's transaction (no database flush per test).
    return Client().post(path, data=body, content_type="application/json", **AUTH)


def rpc(body: bytes):
    answer = post("/rpc", body)
    assert answer.status_code in (200, 204), (answer.status_code, answer.content[:300])
    return answer.json() if answer.status_code == 200 else None


def call(method: str, params=None, *, id_=1) -> bytes:
    message = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


def assert_healthy() -> None:
    assert "provider_id" in rpc(call("tenzro_nodeInfo"))["result"]


def deep(depth: int, inner: bytes = b"") -> bytes:
    return b"[" * depth + inner + b"]" * depth


PARSE_CASES = {
    "100k levels of [": (deep(100_000), "nesting_too_deep"),
    "100k levels of {": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nesting_too_deep"),
    "deep params": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_moeShardMap","params":' + deep(50_000) + b"}",
                    "nesting_too_deep"),
    "NaN": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_moeShardMap","params":{"model_id":NaN}}',
            "non_finite_literal"),
    "Infinity": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_blobGc","params":{"min_age_s":Infinity}}',
                 "non_finite_literal"),
    "-Infinity": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_blobGc","params":{"min_age_s":-Infinity}}',
                  "non_finite_literal"),
    "NaN id": (b'{"jsonrpc":"2.0","id":NaN,"method":"tenzro_nodeInfo"}', "non_finite_literal"),
    "1e999": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_blobGc","params":{"min_age_s":1e999}}',
              "number_out_of_range"),
    "5000-digit integer": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_moeExpertUnload","params":{"layer":'
                           + b"9" * 5000 + b"}}", "number_out_of_range"),
    "invalid UTF-8": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_nodeInfo\xff\xfe"}', "invalid_unicode"),
    "UTF-16": ('{"jsonrpc":"2.0","id":1,"method":"tenzro_nodeInfo"}'.encode("utf-16"), "invalid_unicode"),
    "lone surrogate in id": (b'{"jsonrpc":"2.0","id":"\\ud800","method":"tenzro_nodeInfo"}', "invalid_unicode"),
    "lone surrogate in method": (b'{"jsonrpc":"2.0","id":1,"method":"\\udfff"}', "invalid_unicode"),
    "empty body": (b"", "parse_error"),
    "whitespace": (b"  \n ", "parse_error"),
    "truncated": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_no', "parse_error"),
    "trailing comma": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_nodeInfo",}', "parse_error"),
    "two documents": (b'{"jsonrpc":"2.0","id":1,"method":"tenzro_nodeInfo"}{}', "parse_error"),
}


@pytest.mark.parametrize("name", list(PARSE_CASES))
def test_bodies_that_are_not_json_are_parse_errors_naming_why(name) -> None:
    body, reason = PARSE_CASES[name]
    answer = rpc(body)
    assert answer["error"]["code"] == -32700 and answer["id"] is None
    assert answer["error"]["data"]["reason"] == reason, answer
    assert_healthy()


REQUEST_CASES = {
    "a number": 1,
    "a string": "tenzro_nodeInfo",
    "null": None,
    "empty batch": [],
    "params a string": {"jsonrpc": "2.0", "id": 1, "method": "tenzro_nodeInfo", "params": "x"},
    "params null": {"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeShardMap", "params": None},
    "params a number": {"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeShardMap", "params": 3},
    "method null": {"jsonrpc": "2.0", "id": 1, "method": None},
    "method an object": {"jsonrpc": "2.0", "id": 1, "method": {"name": "tenzro_nodeInfo"}},
    "id an array": {"jsonrpc": "2.0", "id": [1], "method": "tenzro_nodeInfo"},
    "id true": {"jsonrpc": "2.0", "id": True, "method": "tenzro_nodeInfo"},
    "jsonrpc 2": {"jsonrpc": 2, "id": 1, "method": "tenzro_nodeInfo"},
}


@pytest.mark.parametrize("name", list(REQUEST_CASES))
def test_json_that_is_not_a_request_is_an_invalid_request(name) -> None:
    answer = rpc(json.dumps(REQUEST_CASES[name]).encode())
    assert answer["error"]["code"] == -32600 and answer["error"]["data"]["reason"] == "invalid_request", answer


def test_batches_notifications_and_their_limits(settings) -> None:
    settings.TENZRO_RPC_MAX_BATCH = 50
    answers = rpc(json.dumps([1, "x", {"jsonrpc": "2.0", "id": 2, "method": "tenzro_noSuchThing"}]).encode())
    assert [a["error"]["data"]["reason"] for a in answers] == ["invalid_request", "invalid_request",
                                                               "method_not_found"]
    # Notifications are never answered, however wrong; a batch of them answers 204.
    notes = [{"jsonrpc": "2.0", "method": "tenzro_moeShardMap", "params": {"model_id": 5}},
             {"jsonrpc": "2.0", "method": "tenzro_noSuchThing"}, {"jsonrpc": "2.0", "method": "tenzro_nodeInfo"}]
    assert rpc(json.dumps(notes).encode()) is None
    assert rpc(json.dumps(notes[0]).encode()) is None
    mixed = rpc(json.dumps([*notes, json.loads(call("tenzro_nodeInfo", id_="x"))]).encode())
    assert len(mixed) == 1 and mixed[0]["id"] == "x" and "result" in mixed[0]

    huge = rpc(json.dumps([json.loads(call("tenzro_nodeInfo", id_=i)) for i in range(51)]).encode())
    assert huge["error"]["code"] == -32013 and huge["id"] is None
    assert huge["error"]["data"] == {"reason": "batch_too_large", "limit": 50, "setting": "TENZRO_RPC_MAX_BATCH"}
    assert "TENZRO_RPC_MAX_BATCH" in huge["error"]["message"]
    assert len(rpc(json.dumps([json.loads(call("tenzro_nodeInfo", id_=i)) for i in range(50)]).encode())) == 50
    assert_healthy()


# A value of the wrong JSON type for each kind of param (refused in strict and in lax mode).
WRONG = {"string": 12345, "integer": "seven", "number": "seven", "boolean": "maybe", "array": 5, "object": "x"}


def _kind(prop: dict) -> str | None:
    if "type" in prop:
        return prop["type"]
    if "$ref" in prop:
        return "object"
    kinds = [p.get("type", "object") for p in prop.get("anyOf", []) if p.get("type") != "null"]
    return kinds[0] if len(kinds) == 1 else None


FIELDS = [(m.name, field, _kind(prop)) for m in sorted(REGISTRY.values(), key=lambda m: m.name) if m.params
          for field, prop in m.params.model_json_schema().get("properties", {}).items() if _kind(prop)]


def test_every_param_of_every_method_refuses_the_wrong_json_type() -> None:
    assert len(FIELDS) > 60
    calls = [{"jsonrpc": "2.0", "id": i, "method": name, "params": {field: WRONG[kind]}}
             for i, (name, field, kind) in enumerate(FIELDS)]
    answers = {a["id"]: a for a in rpc(json.dumps(calls).encode())}
    for i, (name, field, _) in enumerate(FIELDS):
        error = answers[i]["error"]
        assert error["code"] == -32602 and error["data"]["reason"] == "invalid_params", (name, field, error)
        assert any(e["loc"][:1] == [field] for e in error["data"]["errors"]), (name, field, error)
    assert_healthy()


def test_content_the_edge_can_judge_is_refused_before_the_worker_is_asked() -> None:
    key = {"model_id": "m", "layer": 0, "expert": 0, "d_model": 4}
    cases = {
        "base64 of a wrong length": ("tenzro_moeExecute", {**key, "hidden": "QUJD" + "QQ"}, "invalid_input"),
        "base64 with a bad alphabet": ("tenzro_moeExecute", {**key, "hidden": "AAA!"}, "invalid_input"),
        "base64url": ("tenzro_moeRoute", {**key, "hidden": "-_-_"}, "invalid_input"),
        "base64 with whitespace": ("tenzro_moeForward", {**key, "hidden": "AAAA\nAAAA"}, "invalid_input"),
        "padding inside": ("tenzro_moeExecute", {**key, "hidden": "AA==AAAA"}, "invalid_input"),
        "payload of wrong length": ("tenzro_moeExpertLoad", {"payload": "abc"}, "invalid_input"),
        "empty payload": ("tenzro_moeGateLoad", {"payload": ""}, "invalid_payload"),
        "two payload sources": ("tenzro_moeExpertLoad", {"payload": "AAAA", "path": "/x"}, "invalid_input"),
        "d_model zero": ("tenzro_moeExecute", {**key, "d_model": 0, "hidden": ""}, "invalid_params"),
        "d_model 2^40": ("tenzro_moeRoute", {**key, "d_model": 1 << 40, "hidden": ""}, "invalid_params"),
        "negative layer": ("tenzro_moeExecute", {**key, "layer": -1, "hidden": ""}, "invalid_params"),
        "a million-item array for a string": ("tenzro_moePlanDispatch",
                                              {"model_id": [0] * 1_000_000, "routings": []}, "invalid_params"),
        "a prompt over its bound": ("tenzro_moeGenerate", {"model_id": "m", "prompt_ids": [1] * 5000},
                                    "invalid_params"),
        "too many experts in a routing": ("tenzro_moePlanDispatch", {"model_id": "m", "routings": [
            {"token_index": 0, "experts": [{"layer": 0, "expert": 1}] * 257}]}, "invalid_params"),
        "too many positional": ("tenzro_moeShardMap", ["m"] * 10_000, "invalid_params"),
        "params to a method without": ("tenzro_nodeInfo", {"x": 1}, "invalid_params"),
    }
    calls = [json.loads(call(method, params, id_=name)) for name, (method, params, _) in cases.items()]
    answers = {a["id"]: a for a in rpc(json.dumps(calls).encode())}
    for name, (_, _, reason) in cases.items():
        error = answers[name]["error"]
        assert error["code"] == -32602 and error["data"]["reason"] == reason, (name, error)
    assert_healthy()


# Unparsable bodies (400) meet the one parser every route shares, and every non-object body the
# same ninja check: a few routes show those; an array and an object of wrong types go to all.
REST_BODIES = {
    "100k levels of [": (deep(100_000), 400, "nesting_too_deep"),
    "NaN": (b'{"min_age_s": NaN}', 400, "non_finite_literal"),
    "invalid UTF-8": (b'{"model_id": "\xff"}', 400, "invalid_unicode"),
    "lone surrogate": (b'{"model_id": "\\ud800"}', 400, "invalid_unicode"),
    "truncated": (b'{"model_id": ', 400, "parse_error"),
    "an array": (b"[1, 2]", 422, "invalid_params"),
    "a string": (b'"x"', 422, "invalid_params"),
    "null": (b"null", 422, "invalid_params"),
    "an object of wrong types": (b'{"model_id": 1, "layer": "0", "expert": [], "min_age_s": "x", "policy_id": 1.5, '
                                 b'"receipt_id": true, "payload": 7, "routings": {}, "prompt_ids": "1", "job_ids": 5}',
                                 422, "invalid_params"),
}


@pytest.mark.parametrize("name", list(REST_BODIES))
def test_every_body_taking_rest_route_refuses_hostile_bodies(name) -> None:
    body, status, reason = REST_BODIES[name]
    routes = sorted((m for m in REGISTRY.values() if m.http_method == "POST" and m.params is not None),
                    key=lambda m: m.name)
    assert len(routes) >= 15
    if name not in ("an array", "an object of wrong types"):
        routes = routes[::6]
    for method in routes:
        answer = post(f"/api{method.rest_path}", body)
        assert answer.status_code == status, (method.rest_path, answer.status_code, answer.content[:300])
        assert answer.json()["reason"] == reason, (method.rest_path, answer.json())
    assert_healthy()


def _asgi_post(app, path: str, chunks: list[bytes], *, content_length: int | None) -> tuple[int, dict, bytes]:
    sent: list[dict] = []
    pending = list(chunks)

    async def receive():
        if pending:
            return {"type": "http.request", "body": pending.pop(0), "more_body": bool(pending)}
        await asyncio.sleep(3600)  # the client stays; the app stops listening once it answers

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b"",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1), "scheme": "http", "http_version": "1.1",
             "asgi": {"version": "3.0"}, "root_path": ""}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent if "body" in m)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_bodies_over_the_limit_are_refused_before_they_are_read() -> None:
    app = BodyLimit(get_asgi_application(), limit=1000)
    good = call("tenzro_nodeInfo")
    status, _, body = _asgi_post(app, "/rpc", [good], content_length=len(good))
    assert status == 200 and "result" in json.loads(body)

    # Announced too big: answered at once, nothing read (the receive above would hand out 1 GB).
    status, headers, body = _asgi_post(app, "/rpc", [b"[" * 1000] * 1_000_000, content_length=1 << 30)
    error = json.loads(body)["error"]
    assert status == 413 and headers[b"connection"] == b"close"
    assert error["code"] == -32013 and "TENZRO_RPC_MAX_BYTES (1000 bytes)" in error["message"]
    assert error["data"] == {"reason": "payload_too_large", "limit_bytes": 1000, "setting": "TENZRO_RPC_MAX_BYTES"}

    # Chunked (no Content-Length): refused as soon as the bytes read pass the limit.
    status, _, body = _asgi_post(app, "/api/moe/experts/load", [b" " * 600] * 3 + [b"x"] * 1_000_000,
                                 content_length=None)
    assert status == 413 and json.loads(body)["reason"] == "payload_too_large"
    assert json.loads(body)["limit_bytes"] == 1000
    status, headers, body = _asgi_post(app, "/peer/moe/execute", [b"x"] * 1001, content_length=1001)
    assert status == 413 and headers[b"content-type"] == b"application/x-tenzro-frame"
    assert b'"payload_too_large"' in body and body[:2] == b"TZ"
    status, _, body = _asgi_post(app, "/rpc", [good], content_length=len(good))
    assert status == 200 and "result" in json.loads(body)
