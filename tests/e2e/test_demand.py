"""Replication follows demand, on three real nodes: placed at 2, not hot at a low rate, raised by a load on
one expert, back to 2 once the load has left the rolling window, and no flapping.

a prepares a tiny Qwen3 layer of 8 experts; `tenzro_moePlace` on each node puts every expert on two of
the three (rendezvous) and the gates on a. The hot expert is one whose third node holds another expert
of the model: repair's candidates are the providers holding some expert of it (docs/protocol.md,
"Repair selection"), so a node holding none never adds a copy. With 4 experts, all of them landed on
the same two nodes in 1 run of 27 (3 x 3^-4), and a CI run timed out with every pass reporting the
expert capped at 2 reachable holders; with 8 that happens in 1 run of 2,187, and the test says so.
The meters' window is shortened to 10 s (TENZRO_METER_WINDOW_S) and the repair interval to 2 s, so
demand comes and goes within the test:

1. 200 forwards through a at a low rate: demand is rows served per wall second, far under the
   policy's hot threshold (1,000), so nothing is hot and every expert stays at 2 after two passes.
   (Metered as rows per second of compute, as before, every expert was "hot" and went to 3.)
2. A load generator executes the hot expert on its two holders for a while. With the measured demand D and
   capacity C, the policy's threshold is set to D/10, its headroom to 50 C / D and max_replication to
   100,000, so the expert is hot while a pass sees a tenth of D, and the target, ceil(demand x headroom
   / C), is 3 to 99,999 while the ratio of demand to capacity a pass sees stays within 0.04-2000x the
   test's. A loaded machine serves the generator unevenly, and each holder measures its capacity from
   the calls it got on an expert of microseconds: CI runs saw a pass size it at 16 (the ratio past
   2.7x), and one on a loaded 2-core AMD host saw capacities of 24-75 k rows/s move to 581 k, where
   no pass of a 5.5 C / D headroom added the third holder. The third node fetches the expert (a
   target above 3 is reported as `capped`: there are 3 providers), and no pass targets
   max_replication.
3. The load stops: once it has left the window the expert drops back to 2 (two stable passes), and
   stays there.
"""

from __future__ import annotations

import base64
import threading
import time

import numpy as np
import pytest

from testkit.checkpoints import FileServer, qwen3_moe
from testkit.nodes import TOKEN
from tests.e2e.test_gossip import FAST, wait_for
from tests.e2e.test_prepare_blobs import MODEL, prepare

pytestmark = pytest.mark.e2e
ENV = {**FAST, "TENZRO_REPAIR_TICK_S": "1", "TENZRO_METER_WINDOW_S": "10"}
D_MODEL, N_EXPERTS = 64, 8
EXPERTS = range(N_EXPERTS)
# The load's policy: the target, ceil(demand x headroom / capacity), is HEADROOM at the demand D and capacity C
# the test measured, and max_replication stays clear of it (see the module docstring).
HEADROOM, MAX_REPLICATION = 50.0, 100_000


def propose(node, **changes) -> None:
    proposal = node.result("tenzro_policyPropose", {"changes": changes}, token=TOKEN)
    node.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)


def shard(node) -> dict:
    return node.result("tenzro_moeShardMap", {"model_id": MODEL})


def replication(node) -> dict[int, int]:
    return {e["expert"]: e["replication"] for e in shard(node)["holders"]}


def passes_after(node, started: str) -> list[dict]:
    return [p for p in node.result("tenzro_moeRepairPasses", {"limit": 200})["passes"] if p["started_at"] > started]


def latest_pass(nodes: list) -> str:
    """When the newest repair pass of any of the nodes started ("" before the first)."""
    return max((p["started_at"] for n in nodes for p in n.result("tenzro_moeRepairPasses", {"limit": 1})["passes"]),
               default="")


def hot_expert(seen: dict, by_id: dict) -> tuple[int, object]:
    """The first expert whose one non-holder holds another expert of the model (a repair candidate for it),
    and that node."""
    held = {e["expert"]: {h["provider"] for h in e["holders"]} for e in seen["holders"]}
    for expert, holders in sorted(held.items()):
        (other,) = set(by_id) - holders
        if any(other in h for h in held.values()):
            return expert, by_id[other]
    raise AssertionError(f"rendezvous put all {len(held)} experts on the same two nodes (1 run in 2,187): {held}")


def seen_by(nodes: list, since: str, hot: int) -> str:
    """What each node saw of expert `hot` and what its repair passes since `since` did: a timeout's explanation."""
    lines = []
    for node in nodes:
        entry = next((e for e in shard(node)["holders"] if e["expert"] == hot), {})
        figures = [(h["provider"][:8], h["committed_tps"], h["capacity_tps"]) for h in entry.get("holders", [])]
        passes = [{k: p[k] for k in ("started_at", "considered", "fetched", "capped", "error")}
                  | {"rows": [r for r in p["rows"] if r["expert"] == hot]} for p in passes_after(node, since)]
        lines.append(f"{node.url}: holders (provider, demand, capacity) {figures}; passes {passes[-6:]}")
    return "\n".join(lines)


def b64(rows: np.ndarray) -> str:
    return base64.b64encode(rows.astype("<f4").tobytes()).decode()


class Load:
    """Executes `expert` on each of its holders (a thread each), `rows` per call, at most `calls_per_s`
    calls a second per holder, until stopped. A call that fails (a loaded machine) is counted, not fatal."""

    def __init__(self, holders: list, expert: int, *, rows: int, calls_per_s: float) -> None:
        self.holders, self.expert, self.rows, self.period = holders, expert, rows, 1.0 / calls_per_s
        self.stop = threading.Event()
        self.calls = self.failed = 0
        self.threads = [threading.Thread(target=self.run, args=(node,), daemon=True) for node in holders]

    def run(self, node) -> None:
        hidden = b64(np.random.default_rng(1).standard_normal((self.rows, D_MODEL)))
        at = time.monotonic()
        while not self.stop.is_set():
            answer = node.rpc("tenzro_moeExecute", {"model_id": MODEL, "layer": 0, "expert": self.expert,
                                                    "d_model": D_MODEL, "hidden": hidden})
            self.calls += 1
            self.failed += "result" not in answer
            at += self.period
            self.stop.wait(max(0.0, at - time.monotonic()))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def test_replication_follows_demand_up_and_back_down(start_node, tmp_path) -> None:
    model = qwen3_moe(tmp_path / "ckpt", d_model=D_MODEL, d_ff=32, n_experts=N_EXPERTS)
    with FileServer(model.root) as server:
        a = start_node(env=ENV)
        job = prepare(a, experts=list(EXPERTS), quant="q8_0", checkpoint=server.url)
    b, c = start_node(env=ENV, peers=[a.url]), start_node(env=ENV, peers=[a.url])
    nodes = [a, b, c]
    ids = [n.result("tenzro_nodeInfo")["provider_id"] for n in nodes]
    wait_for(lambda: all(n.result("tenzro_gossipStatus")["known_providers"] == 2 for n in nodes), 60,
             "the three nodes to know each other")
    experts = [{"model_id": MODEL, "layer": 0, "expert": e["expert"], "blob_uri": e["blob_uri"]}
               for e in job["experts"]]
    gates = [{"model_id": MODEL, "layer": 0, "blob_uri": job["gate"]["blob_uri"]}]
    for node in nodes:
        placed = node.result("tenzro_moePlace", {"experts": experts, "gates": gates, "providers": ids,
                                                 "load_gates": node is a}, token=TOKEN)
        assert placed["replication"] == 2 and {r["outcome"] for r in placed["rows"]} <= {"loaded", "elsewhere"}
    twice = dict.fromkeys(EXPERTS, 2)
    wait_for(lambda: all(replication(n) == twice for n in nodes), 60, "every node to see every expert placed twice")
    hot, third = hot_expert(shard(a), dict(zip(ids, nodes, strict=True)))
    for node in nodes:
        propose(node, repair_interval_s=2)

    # 1. 200 forwards at a low rate: nothing becomes hot, replication stays 2 after two passes.
    hidden = np.random.default_rng(0).standard_normal((2, D_MODEL))
    for _ in range(200):
        a.result("tenzro_moeForward", {"model_id": MODEL, "layer": 0, "d_model": D_MODEL, "hidden": b64(hidden)})
        time.sleep(0.02)
    seen = shard(a)
    demand = {e["expert"]: sum(h["committed_tps"] for h in e["holders"]) for e in seen["holders"]}
    print(f"after 200 forwards: demand per expert {demand} rows/s, capacities "
          f"{[h['capacity_tps'] for e in seen['holders'] for h in e['holders']]}")
    assert seen["hot_experts"] == [] and 0 < sum(demand.values()) < 1000
    mark = latest_pass(nodes)
    wait_for(lambda: all(len(passes_after(n, mark)) >= 2 for n in nodes), 60, "two more repair passes everywhere")
    assert all(replication(n) == twice for n in nodes)

    # 2. Demand on one expert: its replication rises by demand.
    holders = [n for n in nodes if n is not third]
    with Load(holders, hot, rows=64, calls_per_s=10) as load:
        time.sleep(11)  # the window fills
        entry = next(e for e in shard(a)["holders"] if e["expert"] == hot)
        d = sum(h["committed_tps"] for h in entry["holders"])
        cap = float(np.median([h["capacity_tps"] for h in entry["holders"]]))
        # 64 rows a call, up to 20 calls a second: however loaded the machine, far above the 200 forwards'
        assert d > 20 and cap > 0, (entry, load.calls, load.failed)
        headroom = HEADROOM * cap / d
        raised = latest_pass(nodes)
        for node in nodes:
            propose(node, hot_threshold_tps=d / 10, repair_headroom=headroom, max_replication=MAX_REPLICATION)
        print(f"load: demand {d} rows/s, one holder's capacity {cap:g} rows/s, headroom set to {headroom:.3g}")
        try:
            wait_for(lambda: replication(a).get(hot) == 3, 90, f"expert {hot} to gain a third holder")
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}\n{seen_by(nodes, raised, hot)}") from None
        assert replication(a) == {**twice, hot: 3}
        rows = [r for p in passes_after(third, raised) for r in p["rows"] if r["expert"] == hot]
        assert "fetched" in [r["outcome"] for r in rows if r["action"] == "add"], rows
        # by demand, not to max_replication: 50 at the figures measured, 3 and more as they move with the load
        targets = [r["target"] for r in rows if r["action"] == "add"]
        assert all(3 <= t < MAX_REPLICATION for t in targets), targets

    # 3. The load has stopped: back to 2 once it has left the window, and it stays there.
    stopped = time.monotonic()
    wait_for(lambda: replication(a).get(hot) == 2, 60, f"expert {hot} to drop back to two holders")
    print(f"back to 2 holders {time.monotonic() - stopped:.1f} s after the load stopped")
    history = []
    for _ in range(6):  # three more passes: no flapping
        time.sleep(1)
        history.append(replication(a).get(hot))
    assert history == [2] * 6
    drops = [r for n in nodes for p in passes_after(n, raised) for r in p["rows"] if r["action"] == "drop"]
    assert "dropped" in [r["outcome"] for r in drops], drops
    assert all(r["expert"] == hot and r["target"] == 2 for r in drops), drops
