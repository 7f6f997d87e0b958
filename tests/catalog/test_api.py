"""Prepare-job edges in-process: validation, what is queued on commit, query counts."""

import json

import pytest

from apps.catalog.models import JobState, PrepareJob

pytestmark = pytest.mark.django_db
AUTH = {"HTTP_AUTHORIZATION": "Bearer test-operator-token"}
_ABSENT = object()


def rpc(client, method, params, **headers):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return client.post("/rpc", data=body, content_type="application/json", **headers).json()


def test_prepare_queues_the_task_only_on_commit(client, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        answer = rpc(client, "tenzro_moePrepareExperts", {"model_id": "m", "layer": 0, "experts": [5, 1, 5],
                                                          "quant": {"gate": "q4_k", "up": "q4_k", "down": "q6_k"},
                                                          "checkpoint": "/nowhere"}, **AUTH)
    job = answer["result"]
    assert job["state"] == "queued" and [e["expert"] for e in job["experts"]] == [1, 5]
    assert len(callbacks) == 1  # the Celery task, sent after the row is committed
    assert PrepareJob.objects.get().experts == [1, 5]


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        # the schema enumerates presets and per-projection types, so these never reach the service
        ({"quant": "q9_9"}, "invalid_params"),
        ({"quant": {"gate": "q4_k"}}, "invalid_params"),
        ({"quant": {"gate": "q4_k", "up": "q4_k", "down": "q7_k"}}, "invalid_params"),
        ({"checkpoint": None}, "invalid_params"),  # absent or a path, never null
        ({"checkpoint": "", "model_id": "not-in-catalog"}, "invalid_params"),
        ({"experts": []}, "invalid_params"),
        ({"experts": [-3]}, "invalid_params"),
        ({"layer": -1}, "invalid_params"),
        ({"model_id": ""}, "invalid_params"),
        # what the schema cannot know: this model has no catalog source to default to
        ({"checkpoint": _ABSENT, "model_id": "not-in-catalog"}, "checkpoint_required"),
    ],
)
def test_prepare_refuses_bad_requests(client, params, reason) -> None:
    base = {"model_id": "m", "layer": 0, "experts": [1], "quant": None, "checkpoint": "/ckpt"}
    merged = {k: v for k, v in {**base, **params}.items() if v is not _ABSENT}
    answer = rpc(client, "tenzro_moePrepareExperts", merged, **AUTH)
    assert answer["error"]["data"]["reason"] == reason
    assert not PrepareJob.objects.exists()


def test_prepare_status_is_one_query(client, django_assert_num_queries) -> None:
    job = PrepareJob.objects.create(model_id="m", layer=0, experts=[0, 1], quant="q8_0", checkpoint="/c",
                                    state=JobState.RUNNING,
                                    results={"gate": {"hash": "a" * 64, "size": 10},
                                             "experts": {"0": {"hash": "b" * 64, "size": 5, "formats": {}}}})
    with django_assert_num_queries(1):
        status = rpc(client, "tenzro_moePrepareStatus", {"job_id": str(job.pk)})["result"]
    assert status["progress"] == {"done": 1, "total": 2}
    assert status["experts"][0]["blob_uri"] == "tenzro://blob/" + "b" * 64
    assert status["experts"][1]["state"] == "pending"
    assert rpc(client, "tenzro_moePrepareStatus", {"job_id": "nope"})["error"]["code"] == -32602
