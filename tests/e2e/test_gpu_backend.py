"""A node with a forced GPU backend, end to end: it advertises `moe_gpu`, the planner sends it the
hot experts, and its expert worker computes them on the device.

Two real nodes on loopback hold the same experts: `cpu` (auto-detection: on CI the only WebGPU
adapter is Mesa's lavapipe, which auto never picks) and `gpu` (TENZRO_EXPERT_BACKEND=wgsl, so
the WGSL backend runs on lavapipe). The planner on `cpu` is asked for the same routings with the
experts cold (policy hot_threshold_tps out of reach) and hot (threshold 0).
"""

from __future__ import annotations

import base64
import subprocess
import sys

import numpy as np
import pytest

from testkit.gpu import cuda_unavailable, wgsl_unavailable
from testkit.nodes import TOKEN, NodeProcess
from tests.e2e.test_gossip import FAST, wait_for
from tests.experts.factories import expert_payload, expert_weights

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(wgsl_unavailable()), reason=wgsl_unavailable() or "")]
MODEL, D_MODEL, D_FF, N_EXPERTS = "test/gpu-bias", 64, 32, 4


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def weights() -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(16)
    return {e: expert_weights(rng, D_MODEL, D_FF) for e in range(N_EXPERTS)}


@pytest.fixture(scope="module")
def pair(start_module_node, weights) -> dict[str, NodeProcess]:
    cpu = start_module_node(env={**FAST, "TENZRO_EXPERT_BACKEND": "auto"})
    gpu = start_module_node(env={**FAST, "TENZRO_EXPERT_BACKEND": "wgsl"}, peers=[cpu.url])
    for e, w in weights.items():
        quant = "Q8_0" if e % 2 else None  # dense and block-quantized experts alike
        for node in (cpu, gpu):
            node.result("tenzro_moeExpertLoad", {"payload": b64(expert_payload(w, expert=e, model_id=MODEL,
                                                                               quant=quant))}, token=TOKEN)
    # the gpu node's signed record says moe_gpu once it is re-issued after the worker published its backend
    wait_for(lambda: (gpu.result("tenzro_gossipStatus")["record"] or {}).get("moe_gpu") is True, 30,
             "the gpu node to announce moe_gpu")
    assert cpu.result("tenzro_gossipStatus")["record"]["moe_gpu"] is False

    def both_seen() -> bool:
        holders = cpu.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]
        # announced: the planner goes by signed records; the shard map also lists this node's own holdings
        # before a peer has dialed it back
        return len(holders) == N_EXPERTS and all(len(h["holders"]) == 2 and all(x["announced"] for x in h["holders"])
                                                 for h in holders)

    wait_for(both_seen, 60, "the cpu node to see both nodes' holdings")
    return {"cpu": cpu, "gpu": gpu}


def set_hot_threshold(node: NodeProcess, tps: int) -> None:
    proposal = node.result("tenzro_policyPropose", {"changes": {"hot_threshold_tps": tps}}, token=TOKEN)
    node.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)


def test_the_forced_backend_says_what_runs_and_why(pair):
    status = pair["gpu"].result("tenzro_moeExpertStatus")
    assert status["gpu_backend_active"] is True and status["backend"] == "wgsl"
    candidates = {c["name"]: c for c in status["compute"]["candidates"]}
    assert candidates["wgsl"]["active"] and candidates["wgsl"]["reason"].startswith("forced: ")
    assert candidates["cuda"]["available"] is None and "not probed" in candidates["cuda"]["reason"]
    assert candidates["cpu"]["active"] is False and "fallback" in candidates["cpu"]["reason"]
    device = status["compute"]["device"]
    assert device["kind"] == "wgsl" and device["state"] == "ok" and device["software"] is True
    assert device["experts"] == N_EXPERTS and 0 < device["memory_used_bytes"] <= device["memory_budget_bytes"]

    status = pair["cpu"].result("tenzro_moeExpertStatus")
    assert status["gpu_backend_active"] is False and status["backend"] == "cpu" and status["compute"]["device"] is None
    reasons = {c["name"]: c["reason"] for c in status["compute"]["candidates"]}
    assert "software" in reasons["wgsl"] or "not installed" in reasons["wgsl"], reasons


def test_planner_sends_hot_experts_to_the_gpu_holder(pair):
    cpu, gpu = pair["cpu"], pair["gpu"]
    gpu_id, cpu_id = (n.result("tenzro_nodeInfo")["provider_id"] for n in (gpu, cpu))
    routings = [{"token_index": t, "experts": [{"layer": 0, "expert": t % N_EXPERTS}]} for t in range(8)]

    def providers() -> set[str]:
        plan = cpu.result("tenzro_moePlanDispatch", {"model_id": MODEL, "routings": routings})
        assert not plan["unroutable"]
        return {b["provider"] for b in plan["batches"]}

    set_hot_threshold(cpu, 10**9)
    assert cpu_id in providers()  # cold experts spread over both holders alike
    set_hot_threshold(cpu, 0)
    assert providers() == {gpu_id}


def test_the_gpu_holder_computes_on_the_device(pair, weights):
    gpu = pair["gpu"]
    live = {"live": True}  # the worker's own counts, not what it last published
    before = gpu.result("tenzro_moeExpertStatus", live)["compute"]["device"]["counts"]
    x = np.random.default_rng(3).standard_normal((5, D_MODEL)).astype(np.float32)
    answer = gpu.result("tenzro_moeExecute", {"model_id": MODEL, "layer": 0, "expert": 0, "d_model": D_MODEL,
                                              "hidden": b64(x.tobytes())})
    y = np.frombuffer(base64.b64decode(answer["output"]), dtype=np.float32).reshape(5, D_MODEL)
    w = {k: v.astype(np.float64) for k, v in weights[0].items()}
    g, u = x @ w["gate"].T, x @ w["up"].T
    reference = (g / (1 + np.exp(-g)) * u) @ w["down"].T
    assert np.abs(y - reference).max() <= 1e-4 * np.abs(reference).max()
    after = gpu.result("tenzro_moeExpertStatus", live)["compute"]["device"]["counts"]
    # the warm-up's MXFP4 pass ran on the CPU (the device kernels do not read MXFP4), nothing since
    assert after["device_rows"] == before["device_rows"] + 5 and after["cpu_rows"] == before["cpu_rows"]
    assert after["cpu_format"] == before["cpu_format"]


def test_a_multi_expert_request_is_one_device_call_with_each_experts_own_answer(pair):
    """docs/operations.md, "Multi-expert requests": a frame of four experts (dense and Q8_0) to the
    GPU holder, as an outsider sends it, runs on the device as one call; its rows are bit for bit
    the single-expert answers, each batch's compute_ms is its share of the call by rows, and the
    CPU holder's answer to the same frame agrees within f32 rounding."""
    import asyncio

    from tests.e2e.test_peer_door import as_outsider

    cpu, gpu = pair["cpu"], pair["gpu"]
    carrier = np.random.default_rng(9).standard_normal((6, D_MODEL)).astype("<f4")
    batches = [{"expert": 3, "rows": [0, 2]}, {"expert": 0, "rows": [1, 2, 3, 4]}, {"expert": 1, "rows": [5]},
               {"expert": 2, "rows": [0, 1, 4]}]
    frame = {"model_id": MODEL, "layer": 0, "d_model": D_MODEL, "batches": batches}

    async def scenario(client):
        multi = await client.ask("moe/execute", frame, carrier.tobytes())
        singles = [await client.ask("moe/execute", {"model_id": MODEL, "layer": 0, "d_model": D_MODEL,
                                                    "expert": b["expert"]}, carrier[b["rows"]].tobytes())
                   for b in batches]
        return multi, singles

    live = {"live": True}
    before = gpu.result("tenzro_moeExpertStatus", live)["compute"]["device"]["counts"]
    (header, body), singles = asyncio.run(as_outsider(gpu.quic_port, scenario))
    assert header["ok"], header
    assert body == b"".join(single[1] for single in singles)
    after = gpu.result("tenzro_moeExpertStatus", live)["compute"]["device"]["counts"]
    assert after["device_rows"] - before["device_rows"] == 2 * 10 and after["cpu_rows"] == before["cpu_rows"]
    shares = [b["compute_ms"] / len(sent["rows"]) for b, sent in zip(header["result"]["batches"], batches, strict=True)]
    assert max(shares) - min(shares) <= 0.001  # ms per row, the same for every batch (rounded to µs)
    (cpu_header, cpu_body), _ = asyncio.run(as_outsider(cpu.quic_port, scenario))
    assert cpu_header["ok"], cpu_header
    ends = np.cumsum([len(b["rows"]) for b in batches])[:-1]
    for sent, y_gpu, y_cpu in zip(batches, *(np.split(np.frombuffer(b, "<f4").reshape(-1, D_MODEL), ends)
                                            for b in (body, cpu_body)), strict=True):
        # dense experts: f32 sums in two orders; Q8_0 ones: the CPU kernel also rounds x to Q8_0
        tolerance = 1e-5 if sent["expert"] % 2 == 0 else 3e-2
        assert np.abs(y_gpu - y_cpu).max() <= tolerance * np.abs(y_cpu).max(), sent


def test_a_forced_backend_that_cannot_run_stops_the_start_with_the_reason(tmp_path):
    argv = [sys.executable, "-m", "cli.main", "node", "run", "--data-dir", str(tmp_path / "node")]
    unknown = subprocess.run([*argv, "--expert-backend", "tpu"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "'tpu' is not one of 'auto', 'cpu'" in unknown.stderr
    if cuda_unavailable() is None:  # a machine with an NVIDIA device starts a node with cuda: nothing to refuse
        return
    refused = subprocess.run([*argv, "--expert-backend", "cuda"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "--expert-backend" in refused.stderr and "TENZRO_EXPERT_BACKEND=cuda, but " in refused.stderr
    assert not (tmp_path / "node").exists()  # refused before anything was created
