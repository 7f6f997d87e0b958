"""The distributed forward across three real nodes under network conditions: delay, jitter, loss.

Each node runs in a network namespace of its own on one bridge (or on loopback where namespaces
cannot be made, e.g. not root, or with TENZRO_TEST_NETNS=0); in front of each node's QUIC door
sits a user-space netem relay (testkit/netem.py: the kernel here has no netem qdisc), which the
node advertises as its QUIC endpoint (testkit/impaired.py). Node a holds only the gate, b and c
every expert (replication 2), so every (token, expert) pair crosses an impaired path. The reference is the single-node
local forward in this process; the relay's own RTT is measured beside it with a plain UDP ping.
"""

from __future__ import annotations

import base64
import os

import numpy as np
import pytest

from core.experts.runtime import ExpertRuntime
from testkit.impaired import ImpairedNetwork, impaired_network
from testkit.netem import Impairment
from testkit.nodes import TOKEN
from tests.e2e.test_gossip import FAST, wait_for
from tests.experts.factories import expert_payload, expert_weights, qwen_gate

pytestmark = pytest.mark.e2e
MODEL, D_MODEL, D_FF, N_ROUTED, TOP_K = "test/qwen3-moe-netem", 64, 32, 8, 2
ENV = {**FAST, "TENZRO_GOSSIP_TTL_S": "60", "TENZRO_FORWARD_ATTEMPT_TIMEOUT_S": "10"}
# 30 ms RTT ± 5 ms (σ 2.5 ms each way, ~3.5 ms on the round trip), as the issue asks; then 2 % loss.
WAN = Impairment(delay_ms=15, jitter_ms=2.5, loss=0.001)
LOSSY = Impairment(delay_ms=15, jitter_ms=2.5, loss=0.02)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[ImpairedNetwork, ExpertRuntime]:
    rng = np.random.default_rng(15)
    gate = qwen_gate(rng, d_model=D_MODEL, n_routed=N_ROUTED, top_k=TOP_K, norm=True, model_id=MODEL)[0]
    experts = [expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=e, model_id=MODEL) for e in range(N_ROUTED)]
    local = ExpertRuntime(data_dir=tmp_path_factory.mktemp("reference"))
    local.gate_load(payload=gate)
    for payload in experts:
        local.expert_load(payload=payload)
    # TENZRO_TEST_NETNS=0 runs the same test on loopback (what a machine without root gets)
    namespaces = os.environ.get("TENZRO_TEST_NETNS", "1") != "0"
    with impaired_network(3, tmp_path_factory.mktemp("netem"), ENV, use_namespaces=namespaces) as network:
        a, b, c = network.nodes
        print(f"\ntopology: {network.topology}")
        a.result("tenzro_moeGateLoad", {"payload": b64(gate)}, token=TOKEN)
        for holder in (b, c):
            for payload in experts:
                holder.result("tenzro_moeExpertLoad", {"payload": b64(payload)}, token=TOKEN)

        def both_holders_seen_with_quic() -> bool:
            shard = a.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]
            return len(shard) == N_ROUTED and all(
                len(e["holders"]) == 2 and all(h["quic_endpoint"] for h in e["holders"]) for e in shard)

        wait_for(both_holders_seen_with_quic, 60, "a to see both holders of every expert, with QUIC doors")
        # One clean forward first: the router's pooled QUIC connections open unimpaired (on a loaded
        # machine, one run's first impaired forward timed out on both holders at once; see the report)
        hidden = np.ones((4, D_MODEL), dtype=np.float32)
        assert "result" in a.rpc("tenzro_moeForward", {"model_id": MODEL, "d_model": D_MODEL,
                                                       "hidden": b64(hidden.tobytes())}, timeout=60)
        yield network, local


@pytest.mark.parametrize("impairment", [WAN, LOSSY], ids=["30ms-rtt-0.1pct-loss", "30ms-rtt-2pct-loss"])
def test_the_forward_stays_correct_under_delay_jitter_and_loss(setup, impairment) -> None:
    network, local = setup
    a = network.nodes[0]
    network.set(impairment)
    ping = network.ping(impairment, count=100)
    before = network.relays.counters()
    rng = np.random.default_rng(int(impairment.loss * 1e4))
    elapsed = []
    for codec in ("f32", "q8_0") * 3:
        hidden = rng.standard_normal((32, D_MODEL)).astype(np.float32)
        answer = a.rpc("tenzro_moeForward", {"model_id": MODEL, "d_model": D_MODEL, "hidden": b64(hidden.tobytes()),
                                             "wire": codec}, timeout=60)
        assert "result" in answer, answer
        result = answer["result"]
        out = np.frombuffer(base64.b64decode(result["output"]), dtype="<f4").reshape(32, D_MODEL)
        want = local.forward_local(model_id=MODEL, layer=0, hidden=hidden)
        error = float(np.linalg.norm(out - want) / np.linalg.norm(want))
        # the bounds of tests/e2e/test_forward.py: f32 is exact up to summation order, Q8_0 within 5 %
        assert error < (1e-5 if codec == "f32" else 0.05), (codec, error)
        assert result["missing"] == [] and result["lost_gate_mass"] == []
        stats = result["stats"]
        assert {h["transport"] for h in stats["holders"] if h["rows"]} == {"quic"}  # the impaired path
        elapsed.append(stats["elapsed_ms"])
    after = network.relays.counters()
    print(f"\n{impairment.describe()} ({network.topology}): relay ping RTT p50 {ping.percentile(50):.1f} ms "
          f"p99 {ping.percentile(99):.1f} ms ({ping.lost}/{ping.sent} lost); forwards {sorted(elapsed)} ms; "
          f"relays: {after.received - before.received} datagrams, {after.lost - before.lost} lost")
    assert after.received > before.received  # the forwards' datagrams did cross the relays
    assert ping.percentile(50) >= 2 * impairment.delay_ms * 0.8  # the relay adds what it says


def exact_f32_forward(router, local: ExpertRuntime, hidden: np.ndarray) -> dict:
    """A forward of hidden f32 [tokens, D_MODEL] on the f32 wire through `router`: its result, checked
    complete and equal to the local forward up to summation order."""
    answer = router.rpc("tenzro_moeForward", {"model_id": MODEL, "d_model": D_MODEL, "hidden": b64(hidden.tobytes()),
                                              "wire": "f32"}, timeout=120)
    assert "result" in answer, answer
    result = answer["result"]
    out = np.frombuffer(base64.b64decode(result["output"]), dtype="<f4").reshape(hidden.shape)
    want = local.forward_local(model_id=MODEL, layer=0, hidden=hidden)
    assert float(np.linalg.norm(out - want) / np.linalg.norm(want)) < 1e-5
    assert result["missing"] == []
    return result


def test_a_large_forward_over_a_lossy_path_is_split_over_lanes_and_stays_exact(setup) -> None:
    """512 tokens' f32 rows to a holder are many congestion windows on a lossy 30 ms path: the router
    splits them by token over more QUIC connections to that holder (docs/protocol.md, "Lanes"),
    opened in the background after the first such forward asks."""
    network, local = setup
    a = network.nodes[0]
    network.set(LOSSY)
    rng = np.random.default_rng(512)
    lanes = []
    for _ in range(4):
        result = exact_f32_forward(a, local, rng.standard_normal((512, D_MODEL)).astype(np.float32))
        lanes.append(max(h["lanes"] for h in result["stats"]["holders"]))
    print(f"\nlanes per forward (the most of one holder): {lanes}")
    assert max(lanes[1:]) > 1


def test_a_nearer_holder_on_a_lossy_path_is_given_fewer_rows_than_a_farther_clean_one(setup) -> None:
    """b is 20 ms nearer than c but loses 10 % of its datagrams. Ranked by round trip and compute alone, the
    rows split about evenly (here 1,000-odd each); weighed by the wire time per byte each holder's answers
    show (docs/protocol.md, "stats"), the farther clean path gets a third more or better once the router's
    view has the measurements (it reads the control plane again every TENZRO_WORKER_CONTROL_TTL_S). How
    much more depends on the holders' measured compute, which at d_model 64 is mostly per-call cost and,
    on a loaded machine, time the holder waited for a core: 1.7x in a CI run, 3x on a quiet machine.

    The loss is 10 % so that the lossy path's time per row stays well above any compute the holders
    measure. At 5 %, one CI run split evenly for 40 forwards though it had measured the near path at 655
    ns a byte and the far one at 171: with those, an even split means the planner counted the farther
    holder's compute at ~165 µs a row or more (under ~6,000 rows/s; quiet runs measure 30,000-290,000),
    as a run whose other tests hold the cores can. The figures start from the earlier tests' (both paths
    lossy then), folded in at 0.3 a forward, so the first forwards may split the other way."""
    network, local = setup
    a, b, c = network.nodes
    network.set(WAN)
    network.set(Impairment(delay_ms=5, jitter_ms=2.5, loss=0.10), node=1)
    near, far = (n.result("tenzro_nodeInfo")["provider_id"] for n in (b, c))
    rng = np.random.default_rng(5)
    seen = []
    for _ in range(60):  # it stops after three forwards in a row that split the right way
        # 1,024 tokens: even a holder given a tenth of the rows moves the 64 KiB a measurement needs
        result = exact_f32_forward(a, local, rng.standard_normal((1024, D_MODEL)).astype(np.float32))
        rows = {h["provider"]: h["rows"] for h in result["stats"]["holders"]}
        seen.append((rows.get(near, 0), rows.get(far, 0)))
        if len(seen) >= 3 and all(4 * n <= 3 * f for n, f in seen[-3:]):
            break
    network.set(WAN)
    wire = {p["provider_id"]: p["wire_ns_per_byte"] for p in a.result("tenzro_networkProviders")["providers"]}
    print(f"\nrows (near lossy, far clean) per forward: {seen}; wire ns/byte near {wire[near]}, far {wire[far]}")
    assert all(4 * n <= 3 * f for n, f in seen[-3:]), seen
    assert wire[near] > wire[far] >= 0, wire
