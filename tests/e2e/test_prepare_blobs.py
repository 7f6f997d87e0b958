"""Prepare jobs, the blob store and loading by blob URI, across real nodes on loopback."""

import asyncio
import base64
import json
import subprocess
import sys
import time

import httpx
import numpy as np
import psutil
import pytest

from apps.blobs.store import blob_hash, parse_blob_uri
from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import prepare_expert
from core.transport.quic import QuicSettings, quic_call
from testkit.checkpoints import FileServer, qwen3_moe
from testkit.nodes import TOKEN
from tests.experts.factories import moe_block_reference, qwen3_router_reference

pytestmark = pytest.mark.e2e
MODEL = "tiny-qwen3"


def wait_job(node, job_id: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = node.result("tenzro_moePrepareStatus", {"job_id": job_id})
        if job["state"] in ("done", "failed"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} still {job['state']} after {timeout_s} s: {job}")


def prepare(node, **params) -> dict:
    job = node.result("tenzro_moePrepareExperts", {"model_id": MODEL, "layer": 0, **params}, token=TOKEN)
    assert job["state"] == "queued"
    return wait_job(node, job["job_id"])


def router_and_two_holders(start_node, tmp_path, *, holder_env: dict, router_env: dict) -> tuple:
    """(a, b, c, job): b prepares one layer's four experts (q8_0) from a tiny Qwen3-MoE checkpoint, b and
    c load them all (c fetches each blob from b: the same weights, announced under the same URI), and
    a, a router peered with b, loads the gate."""
    model = qwen3_moe(tmp_path / "ckpt", d_model=64, d_ff=32, n_experts=4)
    with FileServer(model.root) as server:
        b = start_node(env=holder_env)
        c = start_node(env=holder_env, peers=[b.url])
        a = start_node(env=router_env, peers=[b.url])
        job = prepare(b, experts=[0, 1, 2, 3], quant="q8_0", checkpoint=server.url)
    assert job["state"] == "done", job
    for node in (b, c):
        for entry in job["experts"]:
            node.result("tenzro_moeExpertLoad", {"blob_uri": entry["blob_uri"]}, token=TOKEN)
    a.result("tenzro_moeGateLoad", {"blob_uri": job["gate"]["blob_uri"]}, token=TOKEN)
    return a, b, c, job


@pytest.fixture
def checkpoint(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", d_model=64, d_ff=32, n_experts=4)
    with FileServer(model.root) as server:
        yield model, server


def test_prepare_publish_then_a_peer_fetches_loads_and_forwards(start_node, checkpoint, tmp_path) -> None:
    model, server = checkpoint
    url = server.url
    a = start_node()
    b = start_node(peers=[a.url])

    cli = [sys.executable, "-m", "cli.main", "--node", a.url, "--token", TOKEN, "moe"]
    done = subprocess.run([*cli, "prepare-experts", "--model-id", MODEL, "--layer", "0", "--experts", "0,1,2,3",
                           "--quant", "q8_0", "--checkpoint", url, "--wait"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["state"] == "done" and job["progress"] == {"done": 4, "total": 4}
    assert all(e["formats"] == {"gate": "Q8_0", "up": "Q8_0", "down": "Q8_0"} for e in job["experts"])
    uris = {e["expert"]: e["blob_uri"] for e in job["experts"]}

    # The same job again publishes byte-identical blobs.
    again = prepare(a, experts=[3, 2, 1, 0], quant="q8_0", checkpoint=url)
    assert {e["expert"]: e["blob_uri"] for e in again["experts"]} == uris
    assert again["gate"]["blob_uri"] == job["gate"]["blob_uri"]

    # Node B holds nothing yet: loading by URI fetches from its peer A, verifies, stores, loads.
    b.result("tenzro_moeGateLoad", {"blob_uri": job["gate"]["blob_uri"]}, token=TOKEN)
    for expert, uri in uris.items():
        if expert == 0:
            via_cli = subprocess.run([sys.executable, "-m", "cli.main", "--node", b.url, "--token", TOKEN, "moe",
                                      "load-expert", "--model", MODEL, "--layer", "0", "--expert", "0", "--blob", uri],
                                     capture_output=True, text=True, timeout=60)
            assert via_cli.returncode == 0, via_cli.stderr
            row = json.loads(via_cli.stdout)
        else:
            row = b.result("tenzro_moeExpertLoad", {"blob_uri": uri, "model_id": MODEL, "layer": 0, "expert": expert},
                           token=TOKEN)
        assert row["blob_uri"] == uri
    for uri in [*uris.values(), job["gate"]["blob_uri"]]:
        assert (b.data_dir / "blobs" / parse_blob_uri(uri)[:2] / parse_blob_uri(uri)).is_file()

    hidden = np.random.default_rng(2).standard_normal((5, 64)).astype(np.float32)
    answer = b.result("tenzro_moeForward", {"model_id": MODEL, "d_model": 64,
                                             "hidden": base64.b64encode(hidden.tobytes()).decode()})
    out = np.frombuffer(base64.b64decode(answer["output"]), dtype="<f4").reshape(5, 64)
    dense = {e: {p: model.dense[f"model.layers.0.mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up", "down")}
             for e in range(4)}
    idx, w = qwen3_router_reference(hidden, model.dense["model.layers.0.mlp.gate.weight"], 2, True)
    reference = moe_block_reference(hidden, idx, w, dense, [])
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 0.015  # Q8_0 bound, as in test_ffn


def test_blob_http_ranges_and_quic_blob_get(start_node, checkpoint) -> None:
    _, server = checkpoint
    a = start_node()
    job = prepare(a, experts=[1], quant="q4_k_m", checkpoint=server.url)
    digest = parse_blob_uri(job["experts"][0]["blob_uri"])
    whole = httpx.get(f"{a.url}/blobs/{digest}")
    assert whole.status_code == 200 and blob_hash(whole.content) == digest
    assert len(whole.content) == job["experts"][0]["size"]
    part = httpx.get(f"{a.url}/blobs/{digest}", headers={"Range": "bytes=10-99"})
    assert part.status_code == 206 and part.content == whole.content[10:100]
    assert part.headers["content-range"] == f"bytes 10-99/{len(whole.content)}"
    suffix = httpx.get(f"{a.url}/blobs/{digest}", headers={"Range": "bytes=-16"})
    assert suffix.content == whole.content[-16:]
    assert httpx.get(f"{a.url}/blobs/{digest}", headers={"Range": "bytes=999999999-"}).status_code == 416
    assert httpx.head(f"{a.url}/blobs/{digest}").headers["content-length"] == str(len(whole.content))
    assert httpx.get(f"{a.url}/blobs/{'0' * 64}").status_code == 404
    assert httpx.get(f"{a.url}/blobs/not-a-hash").status_code == 400

    info = a.result("tenzro_nodeInfo")["endpoints"]
    host, port = info["quic"].rsplit(":", 1)
    result, body = asyncio.run(quic_call(host=host, port=int(port), pin_sha256=info["quic_cert_sha256"],
                                         method="blob/get", params={"hash": digest, "start": 5, "end": 50},
                                         settings=QuicSettings(max_body=1 << 24)))
    assert bytes(body) == whole.content[5:50] and result["size"] == len(whole.content)


def test_tampered_blob_is_refused_and_nothing_is_stored(start_node, checkpoint, faults) -> None:
    _, server = checkpoint
    a = start_node()
    b = start_node(peers=[a.url])
    job = prepare(a, experts=[2], quant="q8_0", checkpoint=server.url)
    uri = job["experts"][0]["blob_uri"]
    digest = parse_blob_uri(uri)
    path = a.data_dir / "blobs" / digest[:2] / digest
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    fault = faults.inject("peer serves a tampered blob", "a byte flipped in a's stored blob; b loads it by URI")
    path.write_bytes(bytes(data))

    answer = b.rpc("tenzro_moeExpertLoad", {"blob_uri": uri}, token=TOKEN)
    assert answer["error"]["data"]["reason"] == "hash_mismatch", answer
    assert not (b.data_dir / "blobs" / digest[:2] / digest).exists()
    assert b.result("tenzro_moeExpertStatus")["experts"] == []
    fault.observe("b's load refused with hash_mismatch; nothing stored, nothing loaded")
    fault.close(lost=0)
    # the params schema's pattern names a malformed URI before anything is fetched
    for bad in ("tenzro://blob/xyz", "s3://bucket/expert", "tenzro://blob/" + "A" * 64):
        answer = b.rpc("tenzro_moeExpertLoad", {"blob_uri": bad}, token=TOKEN)
        assert answer["error"]["data"]["reason"] == "invalid_params", answer
        assert answer["error"]["data"]["errors"][0]["loc"] == ["blob_uri"]


def test_prepare_failures_are_reported_with_reasons(start_node, checkpoint, tmp_path) -> None:
    _, server = checkpoint
    a = start_node()
    url = server.url
    assert prepare(a, experts=[9], checkpoint=url)["error"]["reason"] == "expert_out_of_range"
    assert prepare(a, experts=[0], checkpoint=str(tmp_path / "nowhere"))["error"]["reason"] == "not_found"
    invalid = a.rpc("tenzro_moePrepareExperts", {"model_id": MODEL, "layer": 0, "experts": [0], "quant": "q3_x",
                                                 "checkpoint": url}, token=TOKEN)
    assert invalid["error"]["data"]["reason"] == "invalid_params"  # the schema enumerates the presets
    assert invalid["error"]["data"]["errors"][0]["loc"][0] == "quant"
    no_source = a.rpc("tenzro_moePrepareExperts", {"model_id": "unknown-model", "layer": 0, "experts": [0]},
                      token=TOKEN)
    assert no_source["error"]["data"]["reason"] == "checkpoint_required"

    server.ignore_range = True
    failed = prepare(a, experts=[0], checkpoint=url)
    assert failed["state"] == "failed" and failed["error"]["reason"] == "range_ignored"
    assert failed["gate"] is None and not list((a.data_dir / "blobs").glob("??/*"))


def test_prepare_job_survives_a_celery_worker_kill(start_node, tmp_path, faults) -> None:
    # Big enough that the job is still running when the kill lands (~40 ms per expert with the
    # C encoder on this machine, ~1.5 s for the whole job).
    n_experts = 32
    model = qwen3_moe(tmp_path / "big", d_model=1024, d_ff=512, n_experts=n_experts, n_layers=1, shards=2,
                      dtype="F16")
    a = start_node()
    job = a.result("tenzro_moePrepareExperts", {"model_id": MODEL, "layer": 0, "experts": list(range(n_experts)),
                                                "quant": "q4_k_m", "checkpoint": str(model.root)}, token=TOKEN)
    deadline = time.monotonic() + 60
    while a.result("tenzro_moePrepareStatus", {"job_id": job["job_id"]})["progress"]["done"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    worker = next(p for p in a.result("tenzro_nodeProcesses")["processes"] if p["name"] == "celery-worker")
    fault = faults.inject("Celery worker killed during a prepare job",
                          f"SIGKILL to the Celery worker of a {n_experts}-expert q4_k_m prepare job")
    psutil.Process(worker["pid"]).kill()
    killed_at = a.result("tenzro_moePrepareStatus", {"job_id": job["job_id"]})
    assert killed_at["state"] == "running" and killed_at["progress"]["done"] < n_experts, killed_at

    final = wait_job(a, job["job_id"], timeout_s=180)
    assert final["state"] == "done" and final["attempts"] >= 2
    with CheckpointReader.open(str(model.root)) as reader:
        shape = shape_from_config(MODEL, reader.config)
        for entry in final["experts"]:
            payload, _ = prepare_expert(reader, shape, model_id=MODEL, layer=0, expert=entry["expert"], quant="q4_k_m")
            assert parse_blob_uri(entry["blob_uri"]) == blob_hash(payload)
    fault.observe(f"killed at {killed_at['progress']['done']}/{n_experts}; done after {final['attempts']} attempts, "
                  "every blob equal to a fresh slicing")
    fault.close(lost=0)


def test_blob_gc_keeps_what_holdings_and_jobs_reference(start_node, checkpoint) -> None:
    _, server = checkpoint
    a = start_node()
    b = start_node(peers=[a.url], env={"TENZRO_BLOB_GRACE_S": "3"})
    job = prepare(a, experts=[0, 1], quant="q8_0", checkpoint=server.url)
    for entry in job["experts"]:
        b.result("tenzro_moeExpertLoad", {"blob_uri": entry["blob_uri"]}, token=TOKEN)
    assert a.result("tenzro_blobGc", {"min_age_s": 0}, token=TOKEN)["removed"] == []
    assert b.result("tenzro_blobGc", {"min_age_s": 0}, token=TOKEN)["removed"] == []

    # An unloaded expert's blob stays for the grace period (dated from the unload), still served to
    # peers: the copy just dropped may be the last one. After it, garbage collection deletes it.
    time.sleep(3.5)  # the blob was written before the grace period: only the unload can keep it
    b.result("tenzro_moeExpertUnload", {"model_id": MODEL, "layer": 0, "expert": 1}, token=TOKEN)
    digest = parse_blob_uri(job["experts"][1]["blob_uri"])
    assert b.result("tenzro_blobGc", {"min_age_s": 0}, token=TOKEN)["removed"] == []
    assert httpx.get(f"{b.url}/blobs/{digest}", timeout=10).status_code == 200
    time.sleep(3.5)
    assert b.result("tenzro_blobGc", {"min_age_s": 0}, token=TOKEN)["removed"] == [digest]
    assert b.rpc("tenzro_blobGc", {"min_age_s": 0})["error"]["data"]["reason"] == "unauthorized"


def test_catalog_shape_from_the_catalog_and_from_a_checkpoint(start_node, checkpoint) -> None:
    _, server = checkpoint
    a = start_node()
    cli = [sys.executable, "-m", "cli.main", "--node", a.url, "moe", "catalog-shape"]
    shown = subprocess.run([*cli, "--model", "qwen3-30b-a3b"], capture_output=True, text=True, timeout=60, check=True)
    shape = json.loads(shown.stdout)
    assert (shape["n_routed_experts"], shape["n_active"], shape["d_model"], shape["expert_d_ff"]) == (128, 8, 2048, 768)
    assert shape["router"] == "softmax" and shape["sources"]["d_model"]

    unknown = a.rpc("tenzro_moeCatalogShape", {"model": MODEL})
    assert unknown["error"]["data"]["reason"] == "unknown_model" and "qwen3-30b-a3b" in unknown["error"]["message"]
    from_config = a.result("tenzro_moeCatalogShape", {"model": MODEL, "checkpoint": server.url})
    assert (from_config["n_routed_experts"], from_config["n_active"], from_config["d_model"]) == (4, 2, 64)
