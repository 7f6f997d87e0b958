"""REST routes generated from the JSON-RPC registry, and the OpenAPI document."""

import pytest

pytestmark = pytest.mark.django_db
AUTH = {"HTTP_AUTHORIZATION": "Bearer test-operator-token"}


def test_openapi_lists_every_registered_method(client) -> None:
    from apps.api.registry import REGISTRY

    schema = client.get("/api/openapi.json").json()
    operation_ids = {op["operationId"] for path in schema["paths"].values() for op in path.values()}
    assert set(REGISTRY) <= operation_ids
    assert client.get("/api/docs").status_code == 200


def test_read_route(client) -> None:
    body = client.get("/api/governance/policy").json()
    assert body["status"] == "active" and body["max_replication"] == 8


def test_mutating_route_needs_token_and_reports_reason(client) -> None:
    payload = {"changes": {"max_replication": 1, "min_replication": 2}}
    refused = client.post("/api/governance/proposals", payload, content_type="application/json")
    assert refused.status_code == 401 and refused.json()["token"] == "missing"
    refused = client.post("/api/governance/proposals", payload, content_type="application/json",
                          HTTP_AUTHORIZATION="Bearer another-nodes-token")
    assert refused.status_code == 401 and refused.json()["token"] == "not_accepted"
    assert "not accepted" in refused.json()["detail"]
    response = client.post("/api/governance/proposals", payload, content_type="application/json", **AUTH)
    assert response.status_code == 422
    assert response.json()["reason"] == "invalid_policy"


def test_validation_error_on_rest(client) -> None:
    response = client.post("/api/governance/proposals", {"changes": {"min_replication": 0}},
                           content_type="application/json", **AUTH)
    assert response.status_code == 422


def test_invalid_params_on_rest_name_the_field(client) -> None:
    response = client.post("/api/governance/proposals", {"changes": "all of them"}, content_type="application/json",
                           **AUTH)
    body = response.json()
    assert response.status_code == 422 and body["reason"] == "invalid_params"
    assert body["detail"].startswith("invalid params: ") and "changes" in body["detail"], body
