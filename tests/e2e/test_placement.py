"""What a node can find and show by itself, on real nodes: a blob from any provider of its gossip view,
its own holdings before any peer has dialed it back, the experts of a model that nobody holds, and
placement's refusals."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from testkit.checkpoints import FileServer, qwen3_moe
from testkit.nodes import TOKEN
from tests.e2e.test_gossip import FAST, load, wait_for
from tests.e2e.test_prepare_blobs import MODEL, prepare
from tests.experts.factories import MODEL as PAYLOAD_MODEL

pytestmark = pytest.mark.e2e


def test_a_gate_prepared_on_one_node_loads_on_a_router_that_only_knows_a_third(start_node, tmp_path) -> None:
    """x prepares (its gate blob is announced by nobody); y lists only z in --peers and learns x by gossip."""
    model = qwen3_moe(tmp_path / "ckpt", d_model=64, d_ff=32, n_experts=4)
    with FileServer(model.root) as server:
        x = start_node(env=FAST)
        job = prepare(x, experts=[0, 1, 2, 3], quant="q8_0", checkpoint=server.url)
    z = start_node(env=FAST, peers=[x.url])
    y = start_node(env=FAST, peers=[z.url])
    x_id = x.result("tenzro_nodeInfo")["provider_id"]
    wait_for(lambda: y.result("tenzro_gossipStatus")["known_providers"] == 2, 60, "y to learn x through z")
    wait_for(lambda: x.result("tenzro_gossipStatus")["record"]["quic_endpoint"], 60, "x to be dialed back")
    uri = job["gate"]["blob_uri"]

    def loaded() -> dict | None:
        answer = y.rpc("tenzro_moeGateLoad", {"blob_uri": uri}, token=TOKEN)
        return answer.get("result")

    gate = wait_for(loaded, 60, "y to find the gate's blob on x")
    assert (gate["model_id"], gate["layer"], gate["blob_uri"]) == (MODEL, 0, uri)
    calls = y.result("tenzro_workerStatus")["calls"]
    assert calls.get("blob_fetch.quic", 0) >= 1, calls  # from x over its pinned QUIC door, not from z
    # x announces no holding of the model: the blob was found beyond the announced holdings
    assert x_id not in {h["provider"] for e in y.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]
                        for h in e["holders"]}


def test_a_lone_node_shows_its_holdings_and_why_it_does_not_announce_them(start_node) -> None:
    lone = start_node(env=FAST)
    load(lone, np.random.default_rng(0), [0, 1])
    shard = lone.result("tenzro_moeShardMap", {"model_id": PAYLOAD_MODEL})
    me = lone.result("tenzro_nodeInfo")["provider_id"]
    assert shard["unannounced"] == {"provider": me, "reason": "no peer has dialed this node back yet", "experts": 2}
    assert [(e["expert"], e["replication"]) for e in shard["holders"]] == [(0, 1), (1, 1)]
    assert all(h["provider"] == me and h["announced"] is False for e in shard["holders"] for h in e["holders"])
    assert shard["expected_experts"] is None and shard["uncovered_experts"] == []  # the shape is not known
    grid = httpx.get(lone.url + "/shardmap/data.json", params={"model": PAYLOAD_MODEL}, timeout=30).json()
    assert grid["unannounced"]["reason"] == "no peer has dialed this node back yet" and grid["covered_experts"] == 2
    # A peer dials it back: from then on it announces them, and the shard map says nothing more.
    start_node(env=FAST, peers=[lone.url])
    wait_for(lambda: lone.result("tenzro_moeShardMap", {"model_id": PAYLOAD_MODEL})["unannounced"] is None, 60,
             "the lone node to announce its holdings")
    shard = lone.result("tenzro_moeShardMap", {"model_id": PAYLOAD_MODEL})
    assert all(h["announced"] for e in shard["holders"] for h in e["holders"])


def test_uncovered_experts_and_placement_refusals(start_node, tmp_path) -> None:
    model = qwen3_moe(tmp_path / "ckpt", d_model=64, d_ff=32, n_experts=4)
    with FileServer(model.root) as server:
        a = start_node(env=FAST)
        job = prepare(a, experts=[0, 1], quant="q8_0", checkpoint=server.url)  # reads the shape: 2 layers x 4
    a.result("tenzro_moeExpertLoad", {"blob_uri": job["experts"][0]["blob_uri"]}, token=TOKEN)
    shard = a.result("tenzro_moeShardMap", {"model_id": MODEL})
    assert shard["expected_experts"] == 8 and shard["covered_experts"] == 1
    missing = [(0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert shard["uncovered_experts"] == [{"layer": la, "expert": e} for la, e in missing]
    assert [(u["layer"], u["expert"]) for u in shard["under_replicated_experts"]] == [(0, 0), *missing]

    # Place on this node alone: expert 0 is held already, expert 1 loads, and so does the gate; then again.
    first = a.result("tenzro_moePlace", {"job_ids": [job["job_id"]]}, token=TOKEN)
    assert first["replication"] == 1 and first["requested_replication"] == 2  # one provider: capped at 1
    assert [(r["expert"], r["outcome"]) for r in first["rows"]] == [(0, "held"), (1, "loaded")]
    assert first["idle"] == []  # the only provider holds both
    assert [g["outcome"] for g in first["gates"]] == ["loaded"]
    again = a.result("tenzro_moePlace", {"job_ids": [job["job_id"]]}, token=TOKEN)
    assert {r["outcome"] for r in again["rows"] + again["gates"]} == {"held"}

    refused = a.rpc("tenzro_moePlace", {"job_ids": [job["job_id"]], "providers": ["ab" * 32]}, token=TOKEN)
    assert refused["error"]["data"]["reason"] == "not_a_provider", refused
    unknown = a.rpc("tenzro_moePlace", {"job_ids": ["00000000-0000-0000-0000-000000000000"]}, token=TOKEN)
    assert unknown["error"]["data"]["reason"] == "job_not_found", unknown
    # One copy each over this node and eight providers it does not know: at least seven get nothing of the
    # model, and the answer names them (repair never adds a copy there until they hold part of it).
    me = a.result("tenzro_nodeInfo")["provider_id"]
    wide = sorted([me, *(f"{i:02x}" * 32 for i in range(8))])
    spread = a.result("tenzro_moePlace", {"job_ids": [job["job_id"]], "providers": wide, "replication": 1},
                      token=TOKEN)
    given = {r["provider"] for r in spread["rows"]}
    assert spread["idle"] == [{"model_id": MODEL, "providers": [p for p in wide if p not in given]}]
    assert len(spread["idle"][0]["providers"]) >= 7
    assert {r["outcome"] for r in spread["rows"]} <= {"held", "elsewhere"}  # nothing of this node's unloaded
    nothing = a.result("tenzro_moePlace", {}, token=TOKEN)  # nothing named: nothing placed
    assert (nothing["rows"], nothing["gates"]) == ([], [])
    outsider = a.rpc("tenzro_moePlace", {"job_ids": [job["job_id"]]})
    assert outsider["error"]["data"]["reason"] == "unauthorized", outsider
