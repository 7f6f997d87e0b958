"""Prepare-job edges in-process: validation, what is queued on commit, query counts."""

import json

import pytest

from apps.blobs.selectors import blob_store
from apps.blobs.store import parse_blob_uri
from apps.catalog.models import JobState, PrepareJob
from apps.catalog.selectors import prepare_job_to_dict
from apps.catalog.services import prepare_job_run
from core.formats.expert_payload import read_expert_payload
from core.formats.gate_payload import read_gate_payload
from testkit.checkpoints import deepseek_v3, llama_dense

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
    # After the row is committed: the Celery task, and the dashboards' prepare_progressed (queued).
    assert len(callbacks) == 2
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


def test_a_dense_job_defaults_to_every_slice(client, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        job = rpc(client, "tenzro_moePrepareExperts", {"model_id": "m", "layer": 0, "dense_slices": 3,
                                                       "quant": "q8_0", "checkpoint": "/ckpt"}, **AUTH)["result"]
    assert len(callbacks) == 2  # the task and the dashboards' push
    assert (job["dense_slices"], job["dense"], [e["expert"] for e in job["experts"]]) == (3, None, [0, 1, 2])
    subset = rpc(client, "tenzro_moePrepareExperts", {"model_id": "m", "layer": 0, "dense_slices": 3,
                                                      "experts": [2, 1], "checkpoint": "/ckpt"}, **AUTH)["result"]
    assert [e["expert"] for e in subset["experts"]] == [1, 2]
    assert PrepareJob.objects.filter(dense_slices=3).count() == 2


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"experts": _ABSENT}, "invalid_params"),  # neither experts nor dense_slices
        ({"experts": _ABSENT, "dense_slices": 0}, "invalid_params"),
        ({"experts": _ABSENT, "dense_slices": 1025}, "invalid_params"),
        ({"experts": _ABSENT, "dense_slices": True}, "invalid_params"),
        ({"experts": _ABSENT, "dense_slices": None}, "invalid_params"),
        # the schema cannot relate the two: slice ids beyond the cut are a content refusal
        ({"experts": [0, 3], "dense_slices": 3}, "expert_out_of_range"),
    ],
)
def test_dense_prepare_refuses_bad_requests(client, params, reason) -> None:
    base = {"model_id": "m", "layer": 0, "experts": [1], "checkpoint": "/ckpt"}
    merged = {k: v for k, v in {**base, **params}.items() if v is not _ABSENT}
    answer = rpc(client, "tenzro_moePrepareExperts", merged, **AUTH)
    assert answer["error"]["data"]["reason"] == reason, answer
    assert not PrepareJob.objects.exists()
    rest = client.post("/api/moe/prepare", data=json.dumps(merged), content_type="application/json", **AUTH)
    assert rest.status_code == 422 and rest.json()["reason"] == reason


def test_the_schema_says_experts_or_dense_slices(client) -> None:
    schema = client.get("/api/openapi.json").json()["components"]["schemas"]["PrepareParams"]
    assert schema["anyOf"] == [{"required": ["experts"]}, {"required": ["dense_slices"]}]
    assert schema["properties"]["dense_slices"]["minimum"] == 1
    assert schema["properties"]["dense_slices"]["maximum"] == 1024


def test_a_dense_job_runs_publishes_and_resumes(tmp_path) -> None:
    model = llama_dense(tmp_path / "ckpt", d_model=96, d_ff=352)
    job = PrepareJob.objects.create(model_id="tiny-llama", layer=1, experts=[0, 1, 2], quant="q8_0",
                                    checkpoint=str(model.root), dense_slices=3)
    prepare_job_run(job_id=str(job.pk))
    job.refresh_from_db()
    assert job.state == JobState.DONE, job.error
    status = prepare_job_to_dict(job)
    assert status["dense"] == {"d_model": 96, "d_ff": 352, "slice_align": 32}
    assert [e["rows"] for e in status["experts"]] == [[0, 128], [128, 256], [256, 352]]
    store = blob_store()
    gate = read_gate_payload(store.read(parse_blob_uri(status["gate"]["blob_uri"])))
    assert (gate.router, gate.n_shared_experts, gate.dense_d_ff, gate.slice_align) == ("dense", 3, 352, 32)
    for entry in status["experts"]:
        payload = read_expert_payload(store.read(parse_blob_uri(entry["blob_uri"])))
        start, end = entry["rows"]
        assert (payload.layer, payload.expert, payload.d_ff()) == (1, entry["expert"], end - start)

    # a second job with the same arguments publishes the same bytes; a refused one publishes nothing
    again = PrepareJob.objects.create(model_id="tiny-llama", layer=1, experts=[0, 1, 2], quant="q8_0",
                                      checkpoint=str(model.root), dense_slices=3)
    prepare_job_run(job_id=str(again.pk))
    again.refresh_from_db()
    assert again.results["experts"] == job.results["experts"] and again.results["gate"] == job.results["gate"]
    before = set(store.hashes())
    moe = deepseek_v3(tmp_path / "ds")
    for layer, n, reason in ((1, 2, "layer_is_moe"), (0, 14, "dense_slices_out_of_range")):
        refused = PrepareJob.objects.create(model_id="tiny-dsv3", layer=layer, experts=list(range(n)), quant="q8_0",
                                            checkpoint=str(moe.root), dense_slices=n)
        prepare_job_run(job_id=str(refused.pk))
        refused.refresh_from_db()
        assert (refused.state, refused.error_reason) == (JobState.FAILED, reason), refused.error
        assert refused.results.get("gate") is None
    assert set(store.hashes()) == before
