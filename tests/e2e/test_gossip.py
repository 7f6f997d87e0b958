"""Gossip between real nodes on loopback: one shard map, joins, departures, refusals, pinned blobs."""

import asyncio
import base64
import json
import ssl
import time

import httpx
import numpy as np
import pytest
from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration
from blake3 import blake3

from testkit.nodes import TOKEN, NodeProcess
from testkit.records import new_key, signed_record
from tests.e2e.test_peer_door import Outsider
from tests.experts.factories import MODEL, expert_payload, expert_weights

pytestmark = pytest.mark.e2e
FAST = {"TENZRO_GOSSIP_INTERVAL_S": "1", "TENZRO_GOSSIP_HEARTBEAT_S": "1", "TENZRO_GOSSIP_TTL_S": "8",
        "TENZRO_REACHABILITY_CHECK_S": "30"}
D_MODEL, D_FF = 32, 16


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r:.500})")


def load(node: NodeProcess, rng, experts: list[int], layer: int = 0) -> None:
    for expert in experts:
        payload = expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=expert, layer=layer)
        node.result("tenzro_moeExpertLoad", {"payload": base64.b64encode(payload).decode()}, token=TOKEN)


def shard_map(node: NodeProcess) -> dict:
    return node.result("tenzro_moeShardMap", {"model_id": MODEL})


def holders(node: NodeProcess) -> dict:
    return {(e["layer"], e["expert"]): sorted(h["provider"] for h in e["holders"]) for e in shard_map(node)["holders"]}


def ask(port: int, method: str, params: dict) -> dict:
    async def scenario():
        configuration = QuicConfiguration(is_client=True, alpn_protocols=["tenzro/moe"], verify_mode=ssl.CERT_NONE)
        async with connect("127.0.0.1", port, configuration=configuration, create_protocol=Outsider) as client:
            return (await client.ask(method, params))[0]

    return asyncio.run(scenario())


def test_nodes_converge_on_one_shard_map_and_a_stopped_node_leaves_it(start_node) -> None:
    rng = np.random.default_rng(1)
    a = start_node(env=FAST)
    b = start_node(env=FAST, peers=[a.url])
    c = start_node(env=FAST, peers=[b.url])  # knows only b: learns a (and a learns c) by gossip
    d = start_node(env=FAST, peers=[a.url])
    ids = {n.http_port: n.result("tenzro_nodeInfo")["provider_id"] for n in (a, b, c, d)}
    load(a, rng, [0, 1])
    load(b, rng, [1, 2])
    load(c, rng, [3])
    pid = {name: ids[n.http_port] for name, n in zip("abcd", (a, b, c, d), strict=True)}
    expected = {(0, 0): [pid["a"]], (0, 1): sorted([pid["a"], pid["b"]]), (0, 2): [pid["b"]], (0, 3): [pid["c"]]}
    wait_for(lambda: all(holders(n) == expected for n in (a, b, c, d)), 60, "every node to see every holding")
    # d holds nothing: its record still reaches everyone (router_role_count counts it), maybe a round later
    wait_for(lambda: all(n.result("tenzro_gossipStatus")["known_providers"] == 3 for n in (a, b, c, d)), 60,
             "every node to know the three others")
    maps = [shard_map(n) for n in (a, b, c, d)]
    assert all(m == maps[0] for m in maps), "the four nodes disagree on the shard map"
    assert maps[0]["covered_experts"] == 4 and maps[0]["distinct_providers"] == 3
    assert maps[0]["under_replicated_experts"] == [{"layer": 0, "expert": e} for e in (0, 2, 3)]  # min 2
    assert all(n.result("tenzro_gossipStatus")["known_providers"] == 3 for n in (a, b, c, d))

    d.stop()
    wait_for(lambda: all(n.result("tenzro_gossipStatus")["known_providers"] == 2 for n in (a, b, c)), 40,
             "the stopped node to expire everywhere (TTL 8 s)")
    c.stop()  # its holding leaves the shard map with it
    wait_for(lambda: (0, 3) not in holders(a), 40, "c's expert to leave a's shard map")


def test_forged_replayed_expired_and_future_records_are_refused_and_counted(start_node) -> None:
    a = start_node(env=FAST)
    b = start_node(env=FAST, peers=[a.url])
    pid_b = b.result("tenzro_nodeInfo")["provider_id"]
    wait_for(lambda: a.result("tenzro_gossipStatus")["known_providers"] == 1, 30, "a to learn b")
    # An outsider reads b's current record from a (sync with an empty digest answers everything)...
    old = next(r for r in ask(a.quic_port, "gossip/sync", {"digest": {}})["result"]["records"]
               if json.loads(r["record"])["provider_id"] == pid_b)
    load(b, np.random.default_rng(2), [4])  # ...b re-signs with a higher seq...
    wait_for(lambda: holders(a).get((0, 4)) == [pid_b], 30, "a to see b's new record")
    before = a.result("tenzro_gossipStatus")["verdicts"]
    now_ms = int(time.time() * 1000)
    stranger = new_key(99)
    fresh = signed_record(stranger, seq=now_ms, at_ms=now_ms)
    forged = {**fresh.envelope(), "record": fresh.text.replace('"moe_gpu":false', '"moe_gpu":true')}
    expired = signed_record(new_key(98), seq=1, at_ms=now_ms - 3_600_000).envelope()
    # dated an hour ahead (past TENZRO_GOSSIP_MAX_SKEW_S), with a seq that would outrank any honest one
    future = signed_record(new_key(97), seq=2**53, at_ms=now_ms + 3_600_000).envelope()
    answer = ask(a.quic_port, "gossip/push", {"records": [old, forged, expired, future], "heartbeats": []})
    assert answer["result"]["verdicts"] == {"replayed": 1, "forged": 1, "expired": 1, "skewed": 1}

    after = a.result("tenzro_gossipStatus")["verdicts"]
    for verdict in ("replayed", "forged", "expired", "skewed"):
        assert after.get(verdict, 0) >= before.get(verdict, 0) + 1, (verdict, before, after)
    assert a.result("tenzro_gossipStatus")["known_providers"] == 1  # nothing from the stranger got in
    assert holders(a).get((0, 4)) == [pid_b]  # the replay did not roll b back
    # over the HTTP fallback of the peer door too
    over_http = httpx.post(f"{a.url}/peer/gossip/push", json={"params": {"records": [forged], "heartbeats": []}})
    assert over_http.json()["result"]["verdicts"] == {"forged": 1}


def test_a_blob_comes_from_its_holder_over_quic_pinned_by_its_record(start_node, tmp_path) -> None:
    a = start_node(env=FAST)
    b = start_node(env=FAST, peers=[a.url])
    payload = expert_payload(expert_weights(np.random.default_rng(3), D_MODEL, D_FF), expert=7)
    path = tmp_path / "e7.safetensors"
    path.write_bytes(payload)
    uri = "tenzro://blob/" + blake3(payload).hexdigest()
    blob_dir = a.data_dir / "blobs" / uri[-64:][:2]
    blob_dir.mkdir(parents=True, exist_ok=True)
    (blob_dir / uri[-64:]).write_bytes(payload)  # a's store holds it (as a prepare job would leave it)
    a.result("tenzro_moeExpertLoad", {"blob_uri": uri}, token=TOKEN)  # a holds it and announces the blob
    wait_for(lambda: holders(b).get((0, 7)), 30, "b to learn that a holds the blob")
    before = b.result("tenzro_workerStatus")["calls"]
    row = b.result("tenzro_moeExpertLoad", {"blob_uri": uri}, token=TOKEN)
    assert row["blob_uri"] == uri
    calls = b.result("tenzro_workerStatus")["calls"]
    assert calls.get("blob_fetch.quic", 0) == before.get("blob_fetch.quic", 0) + 1
    assert calls.get("blob_fetch.http", 0) == before.get("blob_fetch.http", 0)
