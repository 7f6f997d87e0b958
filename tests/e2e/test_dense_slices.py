"""A dense layer prepared into d_ff slices, loaded by blob URI and run through tenzro_moeForward: on one
real node, then with its slices on three holders (the distributed forward's own pipeline)."""

import base64
import json
import subprocess
import sys

import numpy as np
import pytest

from testkit.checkpoints import FileServer, deepseek_v3
from testkit.nodes import TOKEN
from tests.e2e.test_forward import ENV
from tests.e2e.test_gossip import wait_for
from tests.e2e.test_prepare_blobs import prepare
from tests.experts.factories import swiglu_reference

pytestmark = pytest.mark.e2e
D_MODEL = 160


def forward(node, model_id: str, hidden: np.ndarray, **options) -> np.ndarray:
    answer = node.result("tenzro_moeForward", {"model_id": model_id, "layer": 0, "d_model": D_MODEL,
                                               "hidden": base64.b64encode(hidden.tobytes()).decode(), **options})
    return np.frombuffer(base64.b64decode(answer["output"]), dtype="<f4").reshape(answer["tokens"], D_MODEL)


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def load_by_uri(node, job: dict) -> None:
    """The dense gate and every slice from their tenzro://blob/ URIs, as a holder would."""
    gate = node.result("tenzro_moeGateLoad", {"blob_uri": job["gate"]["blob_uri"]}, token=TOKEN)
    assert (gate["router"], gate["n_routed"], gate["top_k"], gate["n_shared_experts"]) == ("dense", 0, 0, 3)
    for entry in job["experts"]:
        row = node.result("tenzro_moeExpertLoad", {"blob_uri": entry["blob_uri"], "model_id": job["model_id"],
                                                   "layer": 0, "expert": entry["expert"]}, token=TOKEN)
        assert row["d_ff"] == entry["rows"][1] - entry["rows"][0] and row["blob_uri"] == entry["blob_uri"]


def test_dense_layer_in_three_slices_forwards_like_the_layer(start_node, tmp_path) -> None:
    model = deepseek_v3(tmp_path / "ckpt", shards=2)  # layer 0 dense: FP8 SwiGLU, d_ff 408
    dense = {p: model.dense[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up", "down")}
    hidden = np.random.default_rng(12).standard_normal((7, D_MODEL)).astype(np.float32)
    reference = swiglu_reference(dense, hidden)
    node = start_node()
    with FileServer(model.root) as server:
        cli = [sys.executable, "-m", "cli.main", "--node", node.url, "--token", TOKEN, "moe"]
        done = subprocess.run([*cli, "prepare-experts", "--model-id", "tiny-dsv3", "--layer", "0", "--dense-slices",
                               "3", "--checkpoint", server.url, "--wait"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        job = json.loads(done.stdout)
        quantized = prepare(node, model_id="tiny-dsv3-q8", dense_slices=3, quant="q8_0", checkpoint=server.url)
        refused = prepare(node, model_id="tiny-dsv3", layer=1, dense_slices=3, checkpoint=server.url)

    assert job["state"] == "done" and job["dense_slices"] == 3 and job["progress"] == {"done": 3, "total": 3}
    assert job["dense"] == {"d_model": D_MODEL, "d_ff": 408, "slice_align": 1}
    assert [e["rows"] for e in job["experts"]] == [[0, 136], [136, 272], [272, 408]]
    load_by_uri(node, job)
    routed = node.result("tenzro_moeRoute", {"model_id": "tiny-dsv3", "layer": 0, "d_model": D_MODEL,
                                             "hidden": base64.b64encode(hidden.tobytes()).decode()})
    assert all(r["experts"] == [{"layer": 0, "expert": s, "weight": 1.0} for s in range(3)]
               for r in routed["routings"])
    out = forward(node, "tiny-dsv3", hidden)
    # f32 slices are exact cuts of the layer: only f32 rounding separates their sum from the f64 reference
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 1e-5

    # Q8_0 cuts on 32-row blocks; the last slice's 120 down rows fall back to F16
    assert [e["rows"] for e in quantized["experts"]] == [[0, 160], [160, 288], [288, 408]]
    assert quantized["experts"][2]["formats"] == {"gate": "Q8_0", "up": "Q8_0", "down": "F16"}
    load_by_uri(node, quantized)
    out = forward(node, "tiny-dsv3-q8", hidden)
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 0.02  # Q8_0 bound, tests/catalog/test_dense

    status = node.result("tenzro_moeExpertStatus", {"live": True})
    assert sorted(g["router"] for g in status["gates"]) == ["dense", "dense"] and len(status["experts"]) == 6
    assert refused["state"] == "failed" and refused["error"]["reason"] == "layer_is_moe"
    assert refused["gate"] is None


def test_cli_needs_experts_or_dense_slices() -> None:
    cli = [sys.executable, "-m", "cli.main", "--node", "http://127.0.0.1:9", "moe", "prepare-experts",
           "--model-id", "m", "--layer", "0"]
    neither = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert neither.returncode == 2 and "--dense-slices" in neither.stderr
    zero = subprocess.run([*cli, "--dense-slices", "0"], capture_output=True, text=True, timeout=60)
    assert zero.returncode == 2 and "1<=x<=1024" in zero.stderr


def test_slices_on_three_holders_sum_to_the_layer_through_the_distributed_forward(start_node, tmp_path) -> None:
    model = deepseek_v3(tmp_path / "ckpt")
    dense = {p: model.dense[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up", "down")}
    hidden = np.random.default_rng(13).standard_normal((16, D_MODEL)).astype(np.float32)
    reference = swiglu_reference(dense, hidden)
    a = start_node(env=ENV)
    b = start_node(env=ENV, peers=[a.url])
    c = start_node(env=ENV, peers=[a.url])
    job = prepare(a, model_id="tiny-dsv3", dense_slices=3, checkpoint=str(model.root))
    assert job["state"] == "done", job
    # a gates and holds slice 0; b and c fetch slices 1 and 2 from a by their blob URIs
    a.result("tenzro_moeGateLoad", {"blob_uri": job["gate"]["blob_uri"]}, token=TOKEN)
    for node, entry in zip((a, b, c), job["experts"], strict=True):
        node.result("tenzro_moeExpertLoad", {"blob_uri": entry["blob_uri"]}, token=TOKEN)

    def every_slice_seen() -> bool:
        holders = a.result("tenzro_moeShardMap", {"model_id": "tiny-dsv3"})["holders"]
        return sorted((h["expert"], len(h["holders"])) for h in holders) == [(0, 1), (1, 1), (2, 1)]

    wait_for(every_slice_seen, 90, "a to see each slice on its holder")
    answer = a.result("tenzro_moeForward", {"model_id": "tiny-dsv3", "layer": 0, "d_model": D_MODEL, "wire": "f32",
                                            "hidden": base64.b64encode(hidden.tobytes()).decode()})
    out = np.frombuffer(base64.b64decode(answer["output"]), dtype="<f4").reshape(16, D_MODEL)
    assert rel_error(out, reference) < 1e-5  # exact cuts, f32 on the wire: only f32 rounding remains
    stats = answer["stats"]
    assert answer["missing"] == [] and stats["failures"] == []
    by_provider = {h["provider"]: h for h in stats["holders"]}
    providers = [n.result("tenzro_nodeInfo")["provider_id"] for n in (a, b, c)]
    assert set(by_provider) == set(providers) and all(by_provider[p]["rows"] == 16 for p in providers)
    assert by_provider[providers[0]]["transport"] == "local"
    # Q8_0 rows on the wire (the default): tests/e2e/test_forward.py derives its 5% bound
    assert rel_error(forward(a, "tiny-dsv3", hidden), reference) < 0.05

    # A slice is a summand, not an alternative: with its only holder gone the forward fails closed
    c.kill()
    closed = a.rpc("tenzro_moeForward", {"model_id": "tiny-dsv3", "layer": 0, "d_model": D_MODEL,
                                         "hidden": base64.b64encode(hidden.tobytes()).decode()}, timeout=60)
    assert closed["error"]["data"]["reason"] == "forward_incomplete", closed
    assert {(m["expert"], m["token_index"]) for m in closed["error"]["data"]["missing"]} == {(2, t) for t in range(16)}
    partial = a.rpc("tenzro_moeForward", {"model_id": "tiny-dsv3", "layer": 0, "d_model": D_MODEL,
                                          "hidden": base64.b64encode(hidden.tobytes()).decode(),
                                          "allow_partial": True}, timeout=60)
    assert partial["error"]["data"]["reason"] == "forward_incomplete", partial  # no partial dense rows
