"""The distributed layer forward across four real nodes on loopback, at replication 2.

Node a gates (it holds both layers' gates) and holds experts itself; b, c and d hold the rest.
Expert e of each layer is held by nodes[e % 4] and nodes[(e + 1) % 4]. b advertises only HTTP
(its QUIC endpoint is announced on a port nobody serves, so the dial-back refuses it); it alone
holds the experts of a third model, so that its HTTP path is exercised whatever the planner's
latency estimates prefer for the shared experts. The
reference is the single-node local forward: the same runtime code in this process holding
every expert (ExpertRuntime.forward_local).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.experts.runtime import ExpertRuntime
from testkit.nodes import TOKEN, NodeProcess, free_port
from tests.e2e.test_gossip import FAST, wait_for
from tests.experts.factories import deepseek_gate, expert_payload, expert_weights, qwen_gate

pytestmark = pytest.mark.e2e
D_MODEL, D_FF, N_ROUTED, TOP_K = 64, 32, 8, 2
QWEN, DEEPSEEK = "test/qwen3-moe-tiny", "test/deepseek-v3-tiny"
HTTP_ONLY, N_HTTP_ONLY = "test/qwen3-moe-http-only", 4  # held by b alone
# Killed holders stay in the view (TTL 60 s): the forward itself must route around them.
ENV = {**FAST, "TENZRO_GOSSIP_TTL_S": "60", "TENZRO_FORWARD_ATTEMPT_TIMEOUT_S": "10",
       "TENZRO_FORWARD_HEDGE_DEFAULT_S": "0.5", "TENZRO_FORWARD_FAILURE_COOLDOWN_S": "15"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Layers:
    """Both tiny layers: payloads, and the in-process single-node reference runtime."""

    def __init__(self, tmp_path) -> None:
        rng = np.random.default_rng(42)
        self.gates = {
            QWEN: qwen_gate(rng, d_model=D_MODEL, n_routed=N_ROUTED, top_k=TOP_K, norm=True, model_id=QWEN)[0],
            DEEPSEEK: deepseek_gate(rng, d_model=D_MODEL, n_routed=N_ROUTED, top_k=TOP_K, n_group=4, topk_group=2,
                                    n_shared=1, model_id=DEEPSEEK)[0],
            HTTP_ONLY: qwen_gate(rng, d_model=D_MODEL, n_routed=N_HTTP_ONLY, top_k=TOP_K, norm=True,
                                 model_id=HTTP_ONLY)[0],
        }
        self.experts = {(model, e): expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=e, model_id=model)
                        for model, n in ((QWEN, N_ROUTED), (DEEPSEEK, N_ROUTED + 1), (HTTP_ONLY, N_HTTP_ONLY))
                        for e in range(n)}
        self.local = ExpertRuntime(data_dir=tmp_path)
        for payload in self.gates.values():
            self.local.gate_load(payload=payload)
        for payload in self.experts.values():
            self.local.expert_load(payload=payload)

    def reference(self, model: str, hidden: np.ndarray, *, without: frozenset[int] = frozenset()) -> np.ndarray:
        """forward_local; `without`: experts that answered nothing, renormalized as allow_partial does."""
        if not without:
            return self.local.forward_local(model_id=model, layer=0, hidden=hidden)
        routing = self.local.route(model_id=model, layer=0, hidden=hidden)
        n_routed = self.local.gate_spec(model, 0).n_routed
        out = np.zeros_like(hidden, dtype=np.float64)
        for t in range(len(hidden)):
            slots = [(int(e), float(w)) for e, w in zip(routing.experts[t], routing.weights[t], strict=True)]
            routed = [(e, w) for e, w in slots if e < n_routed]
            kept = [(e, w) for e, w in routed if e not in without]
            scale = sum(w for _, w in routed) / sum(w for _, w in kept)
            for e, w in slots:
                if e in without:
                    continue
                y = self.local.execute(model_id=model, layer=0, expert=e, hidden=hidden[t:t + 1])[0]
                out[t] += (w * scale if e < n_routed else w) * y
        return out


@pytest.fixture(scope="module")
def layers(tmp_path_factory) -> Layers:
    return Layers(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module")
def network(start_module_node, layers) -> dict[str, NodeProcess]:
    a = start_module_node(env=ENV)
    b = start_module_node(env={**ENV, "TENZRO_PUBLIC_QUIC": f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}"}, peers=[a.url])
    c = start_module_node(env=ENV, peers=[a.url])
    d = start_module_node(env=ENV, peers=[b.url])
    nodes = [a, b, c, d]
    for payload in layers.gates.values():
        a.result("tenzro_moeGateLoad", {"payload": b64(payload)}, token=TOKEN)
    for (model, e), payload in layers.experts.items():
        for node in (b,) if model == HTTP_ONLY else (nodes[e % 4], nodes[(e + 1) % 4]):
            node.result("tenzro_moeExpertLoad", {"payload": b64(payload)}, token=TOKEN)

    def holders_seen() -> bool:
        for model, n in ((QWEN, N_ROUTED), (DEEPSEEK, N_ROUTED + 1)):
            experts = a.result("tenzro_moeShardMap", {"model_id": model})["holders"]
            if len(experts) != n or any(len(e["holders"]) != 2 for e in experts):
                return False
        return len(a.result("tenzro_moeShardMap", {"model_id": HTTP_ONLY})["holders"]) == N_HTTP_ONLY

    wait_for(holders_seen, 90, "a to see every expert at replication 2")
    return dict(zip("abcd", nodes, strict=True))


def forward(node: NodeProcess, model: str, hidden: np.ndarray, **options) -> dict:
    answer = node.rpc("tenzro_moeForward", {"model_id": model, "d_model": D_MODEL, "hidden": b64(hidden.tobytes()),
                                            **options}, timeout=60)
    return answer


def ok(answer: dict) -> dict:
    if "result" not in answer:
        print("FORWARD ERROR", json.dumps(answer))
    assert "result" in answer, answer
    return answer["result"]


def rows(result: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(result["output"]), dtype="<f4").reshape(result["tokens"], D_MODEL)


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def provider_of(node: NodeProcess) -> str:
    return node.result("tenzro_nodeInfo")["provider_id"]


def scrape(node: NodeProcess) -> dict[tuple[str, tuple], float]:
    """GET /metrics: {(sample name, sorted labels): value}."""
    answer = httpx.get(f"{node.url}/metrics", timeout=10)
    assert answer.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def test_the_distributed_forward_equals_the_local_one(network, layers) -> None:
    a, b = network["a"], network["b"]
    pid_a, pid_b = provider_of(a), provider_of(b)
    rng = np.random.default_rng(7)
    transports: dict[str, set[str]] = {}
    wire = {"f32": [0, 0], "q8_0": [0, 0]}  # bytes and rows that crossed the wire

    def run(model: str, codec: str) -> dict:
        hidden = rng.standard_normal((48, D_MODEL)).astype(np.float32)
        result = ok(forward(a, model, hidden, wire=codec))
        error = rel_error(rows(result), layers.reference(model, hidden))
        # Q8_0 on the wire both ways: each encode rounds a value by at most half a step of its
        # 32-value block (amax/127), i.e. <= sqrt(32)/254 = 2.2% of a block's norm, so the output
        # is within ~2.2% (the answer's encode) plus the input's 2.2% carried through one SwiGLU
        # layer (gain ~1 at these weight scales): a 5% bound; typical errors are ~10x smaller.
        assert error < (1e-5 if codec == "f32" else 0.05), (codec, error)
        assert result["missing"] == [] and result["lost_gate_mass"] == []
        stats = result["stats"]
        # a loaded machine may make a holder slower than its p95 (a hedge races it: "stalled"), never fail it
        assert {f["reason"] for f in stats["failures"]} <= {"stalled"} and stats["replans"] == 0
        assert stats["codecs"] == [codec]
        assert sum(h["rows"] for h in stats["holders"]) == 48 * (TOP_K + (model == DEEPSEEK))
        for h in stats["holders"]:
            transports.setdefault(h["provider"], set()).add(h["transport"])
            # the path's own round trip, which the planner ranks QUIC holders by: measured on QUIC only
            assert (h["rtt_ms"] is not None and 0 < h["rtt_ms"] < 1000) == (h["transport"] == "quic"), h
            # and its wire time per byte, which the planner weighs its rows by: QUIC, and enough bytes to say
            moved = h["bytes_sent"] + h["bytes_received"]
            assert (h["wire_ns_per_byte"] is not None) == (h["transport"] == "quic" and moved >= 64 * 1024), h
            assert h["wire_ns_per_byte"] is None or h["wire_ns_per_byte"] >= 0, h
            if h["provider"] != pid_a:
                wire[codec][0] += h["bytes_sent"] + h["bytes_received"]
                wire[codec][1] += h["rows"]
        return stats

    for model in (QWEN, DEEPSEEK, HTTP_ONLY):
        for codec in ("f32", "q8_0"):
            run(model, codec)
    # A decode step's few rows are gated on the router's event loop, once its shard index is built
    # (counted as computed_inline), with the same answer as the gate on a compute thread.
    inline_before = a.result("tenzro_workerStatus")["calls"].get("operator.computed_inline", 0)
    one = rng.standard_normal((1, D_MODEL)).astype(np.float32)
    for _ in range(2):
        assert rel_error(rows(ok(forward(a, QWEN, one, wire="f32"))), layers.reference(QWEN, one)) < 1e-5
    assert a.result("tenzro_workerStatus")["calls"].get("operator.computed_inline", 0) > inline_before
    assert transports[pid_a] == {"local"}  # a's own experts never cross the wire
    assert transports[pid_b] == {"http"}
    assert set().union(*(t for pid, t in transports.items() if pid not in (pid_a, pid_b))) == {"quic"}
    per_row = {codec: total / rows_ for codec, (total, rows_) in wire.items()}
    assert per_row["f32"] / per_row["q8_0"] > 3.5, per_row  # 32 bits against 8.5 per value, both ways
    # The router's /metrics (its web process) adds up what its expert worker counted: eight forwards
    # in the histogram, batches by transport; holders count the receipts they signed.
    metrics = scrape(a)
    assert metrics[("tenzro_forward_seconds_count", (("model", QWEN), ("stage", "total")))] == 4
    assert sum(v for (name, labels), v in metrics.items() if name == "tenzro_forward_seconds_count"
               and dict(labels)["stage"] == "total") == 8
    batches = {dict(labels)["transport"]: v for (name, labels), v in metrics.items()
               if name == "tenzro_forward_batches_total"}
    assert batches.keys() == {"local", "quic", "http"} and min(batches.values()) > 0
    assert metrics[("tenzro_receipts_total", (("event", "verified"),))] > 0
    assert scrape(b)[("tenzro_receipts_total", (("event", "signed"),))] > 0


def test_a_hanging_holder_is_raced_out_by_its_backup(network, layers, faults) -> None:
    a, c = network["a"], network["c"]
    pid_c = provider_of(c)
    rng = np.random.default_rng(8)
    hidden = rng.standard_normal((64, D_MODEL)).astype(np.float32)
    def c_serves() -> bool:  # and the forwards learn c's latency (its p95 becomes the hedge delay)
        stats = ok(forward(a, QWEN, hidden, wire="f32"))["stats"]
        return any(h["provider"] == pid_c and h["batches"] for h in stats["holders"])

    for _ in range(3):
        c_serves()
    wait_for(c_serves, 60, "c to serve batches (not cooling down from an earlier stall)")
    worker = c.result("tenzro_workerStatus")["pid"]
    fault = faults.inject("holder hangs (SIGSTOP)", "SIGSTOP to holder c's expert worker, two forwards, SIGCONT")
    os.kill(worker, signal.SIGSTOP)
    try:
        result = ok(forward(a, QWEN, hidden, wire="f32"))  # raced, not timed out: c's failure is "stalled"
        again = ok(forward(a, QWEN, hidden, wire="f32"))  # c is still stopped, and now cooling
    finally:
        os.kill(worker, signal.SIGCONT)
    assert rel_error(rows(result), layers.reference(QWEN, hidden)) < 1e-5
    stats = result["stats"]
    assert stats["hedges_fired"] >= 1 and stats["hedges_won"] >= 1, stats
    assert {f["reason"] for f in stats["failures"] if f["provider"] == pid_c} == {"stalled"}
    assert all(h["batches"] == 0 for h in stats["holders"] if h["provider"] == pid_c)
    # planned last while it cools down: no batch waits on it
    assert all(h["batches"] == 0 for h in again["stats"]["holders"] if h["provider"] == pid_c)
    assert rel_error(rows(again), layers.reference(QWEN, hidden)) < 1e-5
    fault.observe(f"both forwards exact; hedges fired {stats['hedges_fired']}, won {stats['hedges_won']}; "
                  "c planned last while it cooled down")
    fault.close(lost=0)


def test_killed_holders_fail_over_then_fail_closed_or_partial(network, layers, faults) -> None:
    a, c, d = network["a"], network["c"], network["d"]
    pid_c, pid_d = provider_of(c), provider_of(d)
    rng = np.random.default_rng(9)
    hidden = rng.standard_normal((32, D_MODEL)).astype(np.float32)
    fault = faults.inject("holders SIGKILLed (d, then c)",
                          "SIGKILL to d, 6 forwards; SIGKILL to c, whose experts then have no holder left")
    d.kill()  # one holder dies in the middle of a stream of forwards
    for model in (QWEN, DEEPSEEK) * 3:
        answer = forward(a, model, hidden)
        assert "result" in answer, answer
        assert rel_error(rows(answer["result"]), layers.reference(model, hidden)) < 0.05  # Q8_0 wire (default)
    penalties = a.result("tenzro_moeHolderPenalties")["by_provider"]
    assert sum(penalties.get(pid_d, {}).values()) >= 1, penalties

    c.kill()  # now experts 2 and 6 (held by c and d) have no holder left
    lost = frozenset({2, 6})
    routed = layers.local.route(model_id=QWEN, layer=0, hidden=hidden).experts
    assert np.isin(routed, list(lost)).any(), "the input must route to a lost expert"
    closed = forward(a, QWEN, hidden)
    assert closed["error"]["data"]["reason"] == "forward_incomplete", closed
    missing = closed["error"]["data"]["missing"]
    assert {m["expert"] for m in missing} == set(np.unique(routed[np.isin(routed, list(lost))]).tolist())
    nothing_left = np.isin(routed, list(lost)).all(axis=1)  # tokens whose every expert is lost
    assert nothing_left.any()
    empty = forward(a, QWEN, hidden, allow_partial=True)  # no result is better than a zero row
    assert empty["error"]["data"]["reason"] == "gate_mass_lost" and "nothing answered" in empty["error"]["message"]

    kept = hidden[~nothing_left]
    routed = routed[~nothing_left]
    partial = ok(forward(a, QWEN, kept, allow_partial=True, wire="f32"))
    assert {m["expert"] for m in partial["missing"]} <= lost and partial["missing"]
    assert rel_error(rows(partial), layers.reference(QWEN, kept, without=lost)) < 1e-5
    lost_share = np.array(partial["lost_gate_mass"])
    assert ((lost_share > 0) == np.isin(routed, list(lost)).any(axis=1)).all()
    too_lossy = forward(a, QWEN, kept, allow_partial=True, min_gate_mass=1.0)
    assert too_lossy["error"]["data"]["reason"] == "gate_mass_lost"
    assert sum(a.result("tenzro_moeHolderPenalties")["by_provider"].get(pid_c, {}).values()) >= 1
    fault.observe("6 forwards exact after d died; with no holder left: forward_incomplete (missing named), "
                  "gate_mass_lost, or a partial answer equal to the reference without the lost experts")
    fault.close(lost=0)
