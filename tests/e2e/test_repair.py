"""Pull-based repair across three real nodes on loopback.

a prepares a tiny Qwen3 layer and holds all four experts from its blobs; c holds experts 0 and 1,
b expert 2 (fetched from a), so experts 0-2 are at min_replication (2) and expert 3 is held once.
With the policy's repair interval shortened to 2 s on every node, the scheduled passes raise
expert 3 to 2: exactly one of b and c (the rendezvous winner) fetches a's blob over the network,
verified by its hash, and announces it; the other discards the row. The node keys are chosen so
that c wins; in the second case c's memory budget is too small for another expert, so c says so
and skips, and b is not forced to take the slot instead. Then b loads expert 0 too: held three
times with no demand, it is trimmed back to its two best-ranked holders after two stable passes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from blake3 import blake3
from nacl.signing import SigningKey

from apps.blobs.store import parse_blob_uri
from apps.repair.selection import rendezvous_order
from testkit.checkpoints import FileServer, qwen3_moe
from testkit.nodes import TOKEN
from tests.e2e.test_gossip import FAST, wait_for
from tests.e2e.test_prepare_blobs import MODEL, prepare

pytestmark = pytest.mark.e2e
ENV = {**FAST, "TENZRO_REPAIR_TICK_S": "1"}


def holders_of(node, expert: int) -> list[str]:
    entries = node.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]
    entry = next((e for e in entries if (e["layer"], e["expert"]) == (0, expert)), None)
    return sorted(h["provider"] for h in entry["holders"]) if entry else []


def _keys_where_c_wins(b_dir: Path, c_dir: Path) -> None:
    """Write b's and c's node keys (ed25519 seeds, as a node writes them) so that c ranks first for
    expert 3 among the two: the same rule both compute, so the test knows who must fetch."""
    b_key = SigningKey(bytes([11]) * 32)
    b_id = b_key.verify_key.encode().hex()
    for n in range(256):
        c_key = SigningKey(bytes([n]) * 32)
        c_id = c_key.verify_key.encode().hex()
        if c_id != b_id and rendezvous_order(MODEL, 0, 3, [b_id, c_id])[0] == c_id:
            break
    for path, key in ((b_dir, b_key), (c_dir, c_key)):
        path.mkdir(parents=True)
        (path / "node.key").write_bytes(bytes(key))
        (path / "node.key").chmod(0o600)


def set_interval(node, seconds: int) -> None:
    proposal = node.result("tenzro_policyPropose", {"changes": {"repair_interval_s": seconds}}, token=TOKEN)
    node.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)


@pytest.mark.parametrize("c_has_room", [True, False])
def test_an_expert_held_once_is_raised_to_two_holders_by_a_scheduled_pass(start_node, tmp_path, c_has_room) -> None:
    model = qwen3_moe(tmp_path / "ckpt", d_model=64, d_ff=32, n_experts=4)
    with FileServer(model.root) as server:
        a = start_node(env=ENV)
        job = prepare(a, experts=[0, 1, 2, 3], quant="q8_0", checkpoint=server.url)
    uris = {e["expert"]: e["blob_uri"] for e in job["experts"]}
    _keys_where_c_wins(tmp_path / "node1", tmp_path / "node2")  # start_node's data dirs for b and c
    # c's memory tier: room for its two experts (~6.5 KB each in memory) and not a third (~7 KB)
    c_env = {} if c_has_room else {"TENZRO_MEMORY_BUDGET_BYTES": str(2 * 7600)}
    b = start_node(env=ENV, peers=[a.url])
    c = start_node(env={**ENV, **c_env}, peers=[a.url])
    nodes = {"a": a, "b": b, "c": c}
    # The default interval's first pass comes after a random share of it, so a node could raise
    # expert 3 before every node has seen it held once: no pass runs until the test shortens it.
    for node in nodes.values():
        set_interval(node, 3600)
    ids = {name: node.result("tenzro_nodeInfo")["provider_id"] for name, node in nodes.items()}
    for expert, uri in uris.items():
        a.result("tenzro_moeExpertLoad", {"blob_uri": uri}, token=TOKEN)
        (c if expert < 2 else b if expert == 2 else a).result("tenzro_moeExpertLoad", {"blob_uri": uri}, token=TOKEN)
    assert rendezvous_order(MODEL, 0, 3, [ids["b"], ids["c"]])[0] == ids["c"]
    winner, loser = "c", "b"
    wait_for(lambda: all([len(holders_of(n, e)) for e in range(4)] == [2, 2, 2, 1] for n in nodes.values()), 60,
             "every node to see expert 3 held once and the others twice")
    for node in nodes.values():
        set_interval(node, 2)

    if not c_has_room:
        def c_skipped() -> dict | None:
            for p in c.result("tenzro_moeRepairPasses", {"limit": 20})["passes"]:
                for row in p["rows"]:
                    if (row["expert"], row["outcome"]) == (3, "skipped"):
                        return row
            return None

        row = wait_for(c_skipped, 60, "c to skip expert 3 for its memory budget")
        assert "memory budget" in row["why"]
        time.sleep(5)  # several more passes: nobody else is forced to take the slot
        assert holders_of(a, 3) == [ids["a"]]
        assert not (nodes[loser].data_dir / "blobs" / parse_blob_uri(uris[3])[:2] / parse_blob_uri(uris[3])).exists()
        return

    wait_for(lambda: holders_of(a, 3) == sorted([ids["a"], ids[winner]]), 60, f"{winner} to hold expert 3 too")
    hash_ = parse_blob_uri(uris[3])
    stored = nodes[winner].data_dir / "blobs" / hash_[:2] / hash_
    assert blake3(stored.read_bytes()).hexdigest() == hash_  # fetched over the network, verified, kept
    passes = nodes[winner].result("tenzro_moeRepairPasses", {"limit": 50})["passes"]
    fetched = [(p, r) for p in passes for r in p["rows"] if r["outcome"] == "fetched"]
    assert [(r["model_id"], r["layer"], r["expert"], r["blob_uri"]) for _, r in fetched] == [(MODEL, 0, 3, uris[3])]
    assert fetched[0][0]["trigger"] == "schedule" and fetched[0][0]["interval_s"] == 2
    assert all(len(p["rows"]) <= p["max_admissions"] for p in passes)
    held = {(e["model_id"], e["layer"], e["expert"]): e["blob_uri"]
            for e in nodes[winner].result("tenzro_moeExpertStatus")["experts"]}
    assert held[(MODEL, 0, 3)] == uris[3]
    # The loser discarded the row naming the winner: it never fetched, and stays so pass after pass.
    time.sleep(5)
    assert holders_of(a, 3) == sorted([ids["a"], ids[winner]])
    loser_rows = [r for p in nodes[loser].result("tenzro_moeRepairPasses", {"limit": 50})["passes"] for r in p["rows"]]
    assert not any(r["expert"] == 3 for r in loser_rows)
    assert nodes[loser].result("tenzro_moeRepairPasses", {"limit": 1})["passes"], "the loser ran passes too"

    # Over-replication: b loads expert 0 too. Held three times with no demand (the keep is
    # min_replication), it loses its lowest-ranked holder, and only once the holders were the same
    # for two passes.
    b.result("tenzro_moeExpertLoad", {"blob_uri": uris[0]}, token=TOKEN)
    wait_for(lambda: len(holders_of(a, 0)) == 3, 60, "a to see expert 0 held three times")
    by_id = {pid: name for name, pid in ids.items()}
    last = by_id[rendezvous_order(MODEL, 0, 0, list(ids.values()))[-1]]
    keep = sorted(pid for pid in ids.values() if by_id[pid] != last)
    wait_for(lambda: holders_of(a, 0) == keep, 90, "expert 0 trimmed to its two best-ranked holders")

    def drop_outcomes() -> list[str] | None:  # the pass that dropped it may still be writing its rows
        passes = nodes[last].result("tenzro_moeRepairPasses", {"limit": 200})["passes"]
        rows = [r["outcome"] for p in reversed(passes) for r in p["rows"] if (r["expert"], r["action"]) == (0, "drop")]
        return rows if rows and rows[-1] == "dropped" else None

    outcomes = wait_for(drop_outcomes, 30, f"{last}'s pass to record the drop")
    assert "drop_pending" in outcomes[:-1], outcomes
    time.sleep(5)
    assert [len(holders_of(a, e)) for e in range(4)] == [2, 2, 2, 2]  # and it stays so: no flapping
