"""No expert is lost to churn while its source exists: the node that prepared it publishes it again.

a prepares a tiny Qwen3 layer (experts 0-3) from a checkpoint folder and holds none of them; b
holds all four, fetched from a's blobs. b is SIGKILLed: nobody holds the experts any more. a's
repair passes (every 2 s) find them lost two passes running and load them again from a's own blob
store (the prepare job's blobs are kept), up to the policy's per-pass limit. Then a's copy of
expert 3 is unloaded and its blob deleted, as a disk lost: the next passes queue the same prepare
job again, and once it is done a loads the blob it published, whose hash is the one announced
before (preparing is deterministic).
"""

from __future__ import annotations

import pytest

from apps.blobs.store import parse_blob_uri
from testkit.checkpoints import qwen3_moe
from testkit.nodes import TOKEN
from tests.e2e.test_gossip import wait_for
from tests.e2e.test_prepare_blobs import MODEL, prepare
from tests.e2e.test_repair import ENV, holders_of, set_interval

pytestmark = pytest.mark.e2e


def held(node) -> dict[int, str]:
    return {e["expert"]: e["blob_uri"] for e in node.result("tenzro_moeExpertStatus", {"live": True})["experts"]}


def recover_rows(node) -> list[dict]:
    passes = node.result("tenzro_moeRepairPasses", {"limit": 20})["passes"]
    return [r for p in passes for r in p["rows"] if r["action"] == "recover"]


def test_experts_whose_last_holder_left_are_published_again_by_the_node_that_prepared_them(
        start_node, tmp_path, faults) -> None:
    model = qwen3_moe(tmp_path / "ckpt", d_model=64, d_ff=32, n_experts=4)
    a = start_node(env=ENV)
    job = prepare(a, experts=[0, 1, 2, 3], quant="q8_0", checkpoint=str(model.root))
    uris = {e["expert"]: e["blob_uri"] for e in job["experts"]}
    b = start_node(env=ENV, peers=[a.url])
    for uri in uris.values():
        b.result("tenzro_moeExpertLoad", {"blob_uri": uri}, token=TOKEN)
    pid_b = b.result("tenzro_nodeInfo")["provider_id"]
    wait_for(lambda: all(holders_of(a, e) == [pid_b] for e in range(4)), 60, "a to see b holding every expert")
    assert held(a) == {}

    fault = faults.inject("last holder lost", "b, the only holder of experts 0-3, SIGKILLed; a prepared them")
    set_interval(a, 2)
    b.kill()
    wait_for(lambda: held(a) == uris, 90, "a to hold the four experts again")
    outcomes = sorted({r["outcome"] for r in recover_rows(a)})
    fault.observe(f"a's recover rows: {outcomes}; a holds {sorted(held(a))} with the blobs announced before")
    assert {"lost_pending", "recovered"} <= set(outcomes), outcomes

    disk = faults.inject("last copy's blob lost", "a's expert 3 unloaded and its blob deleted, nobody else holds it")
    a.result("tenzro_moeExpertUnload", {"model_id": MODEL, "layer": 0, "expert": 3}, token=TOKEN)
    digest = parse_blob_uri(uris[3])
    (a.data_dir / "blobs" / digest[:2] / digest).unlink()
    wait_for(lambda: held(a).get(3) == uris[3], 120, "a to prepare expert 3 again and hold it")
    rows = [r for r in recover_rows(a) if r["expert"] == 3]
    jobs = {r["job_id"] for r in rows if r.get("job_id")}
    disk.observe(f"expert 3's recover rows: {[r['outcome'] for r in rows]}; prepare jobs {sorted(jobs)}; "
                 f"the blob published again: {held(a)[3] == uris[3]}")
    assert "reprepare_queued" in {r["outcome"] for r in rows} and len(jobs) == 1, rows
    assert (a.data_dir / "blobs" / digest[:2] / digest).exists()
    fault.close(lost=4 - len(held(a)))
    disk.close(lost=int(held(a).get(3) != uris[3]))
