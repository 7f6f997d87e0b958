"""Disputes by another holder across real nodes (docs/protocol.md, "Disputes by another holder").

b prepares a tiny Qwen3 layer's experts and holds them; c holds the same blobs; a holds only the
gate, keeps every batch (1 in 1) and disputes. a has no copy of the experts, so it asks the other
holder of the disputed batch's blob for a signed verdict instead of fetching the blob: an honest
batch is dismissed on that verdict, and a never fetches the expert. With that holder gone, a
passes over it, re-executes the batch itself (fetching the blob from the accused) and says so.
"""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from testkit.nodes import TOKEN
from tests.e2e.test_gossip import FAST, wait_for
from tests.e2e.test_prepare_blobs import MODEL, router_and_two_holders

pytestmark = pytest.mark.e2e
ROUTER_ENV = {**FAST, "TENZRO_DISPUTE_VERIFY_TIMEOUT_S": "5"}


def verdict_signed_by(verdict: dict, verifier_id: str) -> bool:
    """docs/protocol.md: ed25519 by verifier_id over "tenzro/verdict/v1\\n" + the canonical text of the
    other fields (checked here with another ed25519 library than the node's)."""
    body = {k: v for k, v in verdict.items() if k != "signature"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(verifier_id)).verify(
        bytes.fromhex(verdict["signature"]), b"tenzro/verdict/v1\n" + text)
    return True


def decided(a, receipt_id: int) -> dict:
    return wait_for(lambda: (d := a.result("tenzro_moeDisputeReceipt", {"receipt_id": receipt_id}, token=TOKEN))
                    ["state"] != "pending" and d, 90, f"the dispute of receipt {receipt_id} to be decided")


def test_a_router_without_the_expert_has_another_holder_verify_and_falls_back_to_itself(start_node, tmp_path,
                                                                                          faults):
    a, b, c, job = router_and_two_holders(start_node, tmp_path, holder_env=FAST, router_env=ROUTER_ENV)
    proposal = a.result("tenzro_policyPropose", {"changes": {"receipt_sample_one_in": 1}}, token=TOKEN)
    a.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)
    ids = {n.result("tenzro_nodeInfo")["provider_id"]: n for n in (b, c)}
    wait_for(lambda: (h := a.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]) and len(h) == 4
             and all({x["provider"] for x in e["holders"]} == set(ids) for e in h), 60,
             "a to see every expert held by b and c")

    hidden = np.random.default_rng(8).standard_normal((16, 64)).astype(np.float32)

    def kept() -> list[dict]:
        answer = a.rpc("tenzro_moeForward", {"model_id": MODEL, "d_model": 64,
                                             "hidden": base64.b64encode(hidden.tobytes()).decode()}, timeout=60)
        assert "result" in answer, answer
        receipts = a.result("tenzro_moeListReceipts", {"model_id": MODEL, "limit": 200})["receipts"]
        return receipts if len({r["provider_id"] for r in receipts}) == 2 or len(receipts) > 40 else []

    receipts = wait_for(kept, 60, "a to keep receipts")  # the worker reads the 1-in-1 policy after a short TTL
    first = receipts[0]
    accused, verifier = first["provider_id"], next(p for p in ids if p != first["provider_id"])
    dispute = decided(a, first["id"])
    assert dispute["state"] == "dismissed" and dispute["penalty"] is None, dispute
    assert dispute["verifier_id"] == verifier and dispute["reexecuted_here"] is False, dispute
    verdict = dispute["verdict"]
    assert verdict["upheld"] is False and verdict["provider_id"] == accused and verdict["verifier_id"] == verifier
    assert verdict["commitment"] == first["commitment_hash"] and verdict_signed_by(verdict, verifier)
    assert verdict["difference_ppm"] <= verdict["tolerance_ppm"] and f"holder {verifier[:16]}" in dispute["detail"]
    blob = blob_hash(job, first)
    assert not (a.data_dir / "blobs" / blob[:2] / blob).exists()  # a never fetched the expert

    # The verifier gone: a passes over it and re-executes the next dispute itself, from the accused's blob.
    fault = faults.inject("dispute verifier killed", "SIGKILL of the holder a asks for a verdict, before a dispute")
    ids[verifier].kill()  # the node's processes: web, worker, Celery
    other = next(r for r in receipts if r["provider_id"] == accused and r["id"] != first["id"])
    started = time.monotonic()
    again = decided(a, other["id"])
    assert again["state"] == "dismissed" and again["reexecuted_here"] is True and again["verifier_id"] == "", again
    # a passed over the dead verifier, or had already let its record expire (a slow machine): either way it
    # re-executed the batch itself, and a verifier it names as passed over is the dead one
    assert "passed over" not in again["detail"] or f"verifier {verifier[:16]}… passed over" in again["detail"], \
        again["detail"]
    assert 0 <= again["difference"] <= again["tolerance"] and time.monotonic() - started < 60
    fetched = blob_hash(job, other)
    assert (a.data_dir / "blobs" / fetched[:2] / fetched).exists()
    fault.observe(f"decided {again['state']} by a itself after {time.monotonic() - started:.1f} s")
    fault.close(lost=int(again["state"] != "dismissed"))


def blob_hash(job: dict, receipt: dict) -> str:
    return next(e["blob_uri"] for e in job["experts"] if e["expert"] == receipt["expert"]).rsplit("/", 1)[1]
