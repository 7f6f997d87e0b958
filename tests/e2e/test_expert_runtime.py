"""The expert-host runtime inside a real node: JSON-RPC and CLI → web → Channels → expert worker."""

import base64
import json
import subprocess
import sys

import numpy as np
import pytest

from testkit.nodes import TOKEN
from tests.e2e.test_gossip import wait_for
from tests.experts.factories import (
    MODEL,
    deepseek_gate,
    deepseek_v3_router_reference,
    expert_payload,
    expert_weights,
    moe_block_reference,
    qwen3_router_reference,
    qwen_gate,
)

pytestmark = pytest.mark.e2e
D_MODEL, D_FF, N_ROUTED, TOP_K = 64, 32, 8, 2


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def rows(answer: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(answer["output"]), dtype="<f4").reshape(answer["tokens"], answer["d_model"])


def load_qwen_layer(node, rng, *, quant=None, layer=0):
    gate_payload, gate_weight = qwen_gate(rng, d_model=D_MODEL, n_routed=N_ROUTED, top_k=TOP_K, norm=True,
                                          layer=layer)
    node.result("tenzro_moeGateLoad", {"payload": b64(gate_payload)}, token=TOKEN)
    weights = {}
    for expert in range(N_ROUTED):
        weights[expert] = expert_weights(rng, D_MODEL, D_FF)
        row = node.result("tenzro_moeExpertLoad",
                          {"payload": b64(expert_payload(weights[expert], expert=expert, layer=layer, quant=quant)),
                           "model_id": MODEL, "layer": layer, "expert": expert}, token=TOKEN)
        assert row["tier"] == "memory" and row["blob_uri"] is None
    return gate_weight, weights


def test_load_route_execute_forward_match_the_references(start_node) -> None:
    node = start_node()
    rng = np.random.default_rng(11)
    gate_weight, weights = load_qwen_layer(node, rng)
    hidden = rng.standard_normal((5, D_MODEL)).astype(np.float32)
    params = {"model_id": MODEL, "layer": 0, "d_model": D_MODEL, "hidden": b64(hidden.tobytes())}

    routed = node.result("tenzro_moeRoute", params)
    idx, w = qwen3_router_reference(hidden, gate_weight, TOP_K, True)
    got_idx = np.array([[s["expert"] for s in r["experts"]] for r in routed["routings"]])
    got_w = np.array([[s["weight"] for s in r["experts"]] for r in routed["routings"]])
    np.testing.assert_array_equal(got_idx, idx)
    np.testing.assert_allclose(got_w, w, rtol=1e-5)

    executed = rows(node.result("tenzro_moeExecute", {**params, "expert": 3}))
    expected = moe_block_reference(hidden, np.full((5, 1), 3), np.ones((5, 1)), weights, [])
    np.testing.assert_allclose(executed, expected, rtol=1e-4, atol=1e-6)

    combined = rows(node.result("tenzro_moeForward", params))
    np.testing.assert_allclose(combined, moe_block_reference(hidden, idx, w, weights, []), rtol=1e-4, atol=1e-6)

    status = node.result("tenzro_moeExpertStatus")
    assert status["counts"] == {"warm": N_ROUTED, "cold": 0, "gates": 1}
    assert status["gpu_backend_active"] is False and status["cpu_kernel"]
    assert 0 < status["memory_used_bytes"] <= status["memory_budget_bytes"]


def test_deepseek_layer_with_shared_expert_and_q8_0(start_node) -> None:
    node = start_node()
    rng = np.random.default_rng(5)
    n_shared = 1
    gate_payload, gate_weight, bias = deepseek_gate(rng, d_model=D_MODEL, n_routed=N_ROUTED, top_k=TOP_K, n_group=4,
                                                    topk_group=2, n_shared=n_shared, bias_shift=-0.5)
    node.result("tenzro_moeGateLoad", {"payload": b64(gate_payload), "model_id": MODEL, "layer": 0}, token=TOKEN)
    weights = {e: expert_weights(rng, D_MODEL, D_FF) for e in range(N_ROUTED + n_shared)}
    for expert, w in weights.items():
        node.result("tenzro_moeExpertLoad", {"payload": b64(expert_payload(w, expert=expert, quant="q8_0"))},
                    token=TOKEN)
    hidden = rng.standard_normal((6, D_MODEL)).astype(np.float32)
    combined = rows(node.result("tenzro_moeForward", {"model_id": MODEL, "d_model": D_MODEL,
                                                       "hidden": b64(hidden.tobytes())}))
    idx, w = deepseek_v3_router_reference(hidden, gate_weight, bias, top_k=TOP_K, n_group=4, topk_group=2,
                                          norm_topk_prob=True, routed_scaling_factor=2.5)
    reference = moe_block_reference(hidden, idx, w, weights, [N_ROUTED])
    # Q8_0 weights: per-element error ≈ step/√12 ≈ 0.23% of the block max; a 1.5% relative bound on the
    # combined output leaves room for sums of several experts (see tests/experts/test_ffn.py).
    assert np.linalg.norm(combined - reference) / np.linalg.norm(reference) < 0.015
    formats = {row["expert"]: row["formats"] for row in node.result("tenzro_moeExpertStatus")["experts"]}
    assert set(formats[0].values()) == {"Q8_0"}


def test_bad_input_gets_a_named_error_and_the_node_stays_up(start_node) -> None:
    node = start_node()
    rng = np.random.default_rng(3)
    load_qwen_layer(node, rng)
    hidden = rng.standard_normal((2, D_MODEL)).astype(np.float32)
    good = {"model_id": MODEL, "layer": 0, "d_model": D_MODEL, "hidden": b64(hidden.tobytes())}

    def error(method, params, token=None):
        answer = node.rpc(method, params, token=token)
        assert "error" in answer, answer
        return answer["error"]["data"]["reason"], answer["error"]["message"]

    assert error("tenzro_moeForward", {**good, "d_model": 48})[0] == "shape_mismatch"
    assert error("tenzro_moeForward", {**good, "d_model": 60})[0] == "shape_mismatch"  # not whole rows
    nan_rows = hidden.copy()
    nan_rows[1, 7] = np.nan
    assert error("tenzro_moeForward", {**good, "hidden": b64(nan_rows.tobytes())})[0] == "non_finite_input"
    assert error("tenzro_moeExecute", {**good, "expert": 42})[0] == "expert_not_loaded"
    assert error("tenzro_moeForward", {**good, "model_id": "other/model"})[0] == "gate_not_loaded"
    assert error("tenzro_moeForward", {**good, "hidden": "%%%not base64"})[0] == "invalid_input"

    payload = bytearray(expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=1))
    truncated = b64(bytes(payload[: len(payload) // 2]))
    assert error("tenzro_moeExpertLoad", {"payload": truncated}, TOKEN)[0] == "invalid_payload"
    reason, message = error("tenzro_moeExpertLoad", {"payload": b64(bytes(payload)), "expert": 2}, TOKEN)
    assert reason == "model_mismatch" and "expert 2" in message
    wide = expert_payload(expert_weights(rng, D_MODEL * 2, D_FF), expert=1)
    assert error("tenzro_moeExpertLoad", {"payload": b64(wide)}, TOKEN)[0] == "model_mismatch"
    assert error("tenzro_moeExpertLoad", {"payload": b64(bytes(payload))})[0] == "unauthorized"

    # Nothing was lost or replaced, and the node still computes.
    assert node.result("tenzro_moeExpertStatus")["counts"]["warm"] == N_ROUTED
    assert rows(node.result("tenzro_moeForward", good)).shape == (2, D_MODEL)


def test_tiny_budget_spills_and_restart_keeps_disk_tier_experts(start_node) -> None:
    expert_bytes = 3 * D_MODEL * D_FF * 4
    node = start_node(env={"TENZRO_MEMORY_BUDGET_BYTES": str(3 * expert_bytes)})
    rng = np.random.default_rng(8)
    load_qwen_layer(node, rng)
    status = node.result("tenzro_moeExpertStatus")
    assert status["memory_used_bytes"] <= 3 * expert_bytes
    assert status["counts"] == {"warm": 3, "cold": N_ROUTED - 3, "gates": 1}

    hidden = rng.standard_normal((4, D_MODEL)).astype(np.float32)
    params = {"model_id": MODEL, "d_model": D_MODEL, "hidden": b64(hidden.tobytes())}
    before = rows(node.result("tenzro_moeForward", params))

    node.stop()
    node.start(TENZRO_MEMORY_BUDGET_BYTES=str(3 * expert_bytes))
    # every payload comes back Cold; the warm-up promotes what fits the budget, evicting nothing
    status = wait_for(lambda: (s := node.result("tenzro_moeExpertStatus"))["counts"]["warm"] == 3 and s, 30,
                      "the warm-up to fill the memory tier")
    assert status["counts"] == {"warm": 3, "cold": N_ROUTED - 3, "gates": 1}
    after = rows(node.result("tenzro_moeForward", params))
    np.testing.assert_array_equal(after, before)  # disk tier decodes back bit-identically
    assert node.result("tenzro_moeExpertStatus")["memory_used_bytes"] <= 3 * expert_bytes


def test_cli_load_status_forward(start_node, tmp_path) -> None:
    node = start_node()
    rng = np.random.default_rng(21)
    gate_payload, gate_weight = qwen_gate(rng, d_model=D_MODEL, n_routed=N_ROUTED, top_k=TOP_K, norm=False)
    (tmp_path / "gate.safetensors").write_bytes(gate_payload)
    cli = [sys.executable, "-m", "cli.main", "--node", node.url, "--token", TOKEN, "moe"]

    def run(*args):
        done = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    run("load-gate", "--model", MODEL, "--layer", "0", "--file", str(tmp_path / "gate.safetensors"))
    weights = {}
    for expert in range(N_ROUTED):
        weights[expert] = expert_weights(rng, D_MODEL, D_FF)
        path = tmp_path / f"l0-e{expert}.safetensors"
        path.write_bytes(expert_payload(weights[expert], expert=expert, quant="q4_k_m"))
        run("load-expert", "--model", MODEL, "--layer", "0", "--expert", str(expert), "--file", str(path))
    assert run("status")["counts"]["warm"] == N_ROUTED

    hidden = rng.standard_normal((3, D_MODEL)).astype(np.float32)
    (tmp_path / "hidden.f32").write_bytes(hidden.tobytes())
    done = subprocess.run([*cli, "forward", "--model", MODEL, "--hidden", str(tmp_path / "hidden.f32"), "--d-model",
                           str(D_MODEL), "--out", str(tmp_path / "out.f32")],
                          capture_output=True, text=True, timeout=60)
    summary = json.loads(done.stdout)
    assert summary["tokens"] == 3 and summary["bytes"] == 3 * D_MODEL * 4
    # one line for people on stderr (stdout stays JSON): holders by name, the wire's codec, the hedges
    assert done.stderr.startswith("forward ") and "wire codecs:" in done.stderr and "hedges fired" in done.stderr
    out = np.fromfile(tmp_path / "out.f32", dtype="<f4").reshape(3, D_MODEL)
    idx, w = qwen3_router_reference(hidden, gate_weight, TOP_K, False)
    reference = moe_block_reference(hidden, idx, w, weights, [])
    # q4_k_m: ~11% relative error per expert (tests/experts/test_ffn.py derives it); 15% bound.
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 0.15

    wrong = subprocess.run([*cli, "load-expert", "--model", "other", "--layer", "0", "--expert", "0", "--file",
                            str(tmp_path / "l0-e0.safetensors")], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "model_mismatch" in wrong.stderr and wrong.stderr.count("\n") == 1

    # An f32 expert at d_model 1024, d_ff 4096 is 48 MiB: as base64 inside JSON it passed the 64 MiB
    # request limit. The node on this host reads the file itself; --path names a file on its disk.
    big = tmp_path / "l1-e0.safetensors"
    big.write_bytes(expert_payload(expert_weights(rng, 1024, 4096), expert=0, quant=None, layer=1))
    assert big.stat().st_size > 48 * 2**20
    row = run("load-expert", "--model", MODEL, "--layer", "1", "--expert", "0", "--file", str(big))
    assert (row["d_model"], row["d_ff"]) == (1024, 4096)
    run("unload-expert", "--model", MODEL, "--layer", "1", "--expert", "0")
    assert run("load-expert", "--model", MODEL, "--layer", "1", "--expert", "0", "--path", str(big))["d_ff"] == 4096
    missing = subprocess.run([*cli, "load-expert", "--model", MODEL, "--layer", "1", "--expert", "0", "--path",
                              str(tmp_path / "nowhere.safetensors")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "file_not_found" in missing.stderr
