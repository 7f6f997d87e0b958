"""Receipts, sampling, disputes and settlement across real nodes on loopback.

Node b prepares a tiny Qwen3 layer's experts from a checkpoint and holds them (from its blobs);
node a holds only the gate, so every batch of a's forward is b's remote work: signed by b,
verified by a, kept in full by a's sampling (the policy's 1 in N set to 1 in 1 here), settled
by a's Celery worker at b's advertised price, and disputed by a, which holds no copy of the
expert and fetches b's blob to re-execute it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from decimal import Decimal

import numpy as np
import pytest
from playwright.sync_api import expect

from testkit.checkpoints import FileServer, qwen3_moe
from testkit.nodes import TOKEN
from tests.dashboard.test_browser import page  # noqa: F401  (the fixture: a real chromium)
from tests.e2e.test_gossip import FAST, wait_for
from tests.e2e.test_prepare_blobs import MODEL, prepare

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
PRICE = "0.0000025"


@pytest.fixture
def network(start_node, tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", d_model=64, d_ff=32, n_experts=4)
    with FileServer(model.root) as server:
        b = start_node(env={**FAST, "TENZRO_PRICE_PER_INPUT_TOKEN": PRICE})
        a = start_node(env=FAST, peers=[b.url])
        job = prepare(b, experts=[0, 1, 2, 3], quant="q8_0", checkpoint=server.url)
    assert job["state"] == "done", job
    for entry in job["experts"]:
        b.result("tenzro_moeExpertLoad", {"blob_uri": entry["blob_uri"]}, token=TOKEN)
    a.result("tenzro_moeGateLoad", {"blob_uri": job["gate"]["blob_uri"]}, token=TOKEN)  # fetched from b
    proposal = a.result("tenzro_policyPropose", {"changes": {"receipt_sample_one_in": 1}}, token=TOKEN)
    a.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)
    pid_b = b.result("tenzro_nodeInfo")["provider_id"]

    def b_seen() -> bool:
        holders = a.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]
        return len(holders) == 4 and all(h["holders"] and h["holders"][0]["provider"] == pid_b for h in holders)

    wait_for(b_seen, 60, "a to see b's four experts")
    return a, pid_b


def forward(node, hidden: np.ndarray) -> dict:
    answer = node.rpc("tenzro_moeForward", {"model_id": MODEL, "d_model": 64,
                                             "hidden": base64.b64encode(hidden.tobytes()).decode()}, timeout=60)
    assert "result" in answer, answer
    return answer["result"]


def test_remote_work_is_verified_kept_settled_and_disputed(network, page) -> None:  # noqa: F811
    a, pid_b = network
    page.goto(a.url + "/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    hidden = np.random.default_rng(5).standard_normal((12, 64)).astype(np.float32)
    # The worker reads the policy through its control-plane view (a short TTL): wait for 1 in 1.
    deadline = time.monotonic() + 30
    while True:
        result = forward(a, hidden)
        listed = a.result("tenzro_moeListReceipts", {"model_id": MODEL})
        if listed["total"] >= result["stats"]["batches"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    stats = result["stats"]
    assert stats["failures"] == [] and [h["provider"] for h in stats["holders"]] == [pid_b]
    served_rows = stats["holders"][0]["rows"]
    assert stats["holders"][0]["receipts"] == stats["holders"][0]["batches"] == stats["batches"]
    assert served_rows == 12 * 2  # top-2: every (token, expert) pair went to b
    receipts = listed["receipts"]
    via_cli = subprocess.run([sys.executable, "-m", "cli.main", "--node", a.url, "moe", "receipts", "--model",
                              MODEL, "--holder", pid_b], capture_output=True, text=True, timeout=30)
    assert via_cli.returncode == 0, via_cli.stderr
    assert json.loads(via_cli.stdout)["total"] == listed["total"]
    assert len(receipts) >= stats["batches"] and {r["provider_id"] for r in receipts} == {pid_b}
    # The open dashboard lists them as they are kept (pushed over its websocket, no reload).
    newest = page.locator("#receipts tbody tr").first
    expect(newest.locator("td").nth(6)).to_have_text(receipts[0]["commitment_hash"][:16] + "…", timeout=15000)
    expect(newest.locator("td").nth(4).locator(".provider")).to_have_attribute("title", pid_b)

    # Settlement: a's Celery worker pays b price x tokens, split by the policy, once per forward.
    def settled() -> dict | None:
        rows = a.result("tenzro_moeSettlements", {"limit": 50})["settlements"]
        return next((s for s in rows if s["forward_id"] == stats["forward_id"]), None)

    settlement = wait_for(settled, 30, "the forward's settlement")
    policy = a.result("tenzro_policyGet")
    gross = Decimal(PRICE) * served_rows
    holder_entry = next(e for e in settlement["entries"] if e["kind"] == "holder")
    assert holder_entry["account"] == pid_b and holder_entry["tokens"] == served_rows
    assert Decimal(holder_entry["amount"]) == (gross * Decimal(str(policy["settlement_holder_share"]))).quantize(
        Decimal(10) ** -12)
    assert sum(Decimal(e["amount"]) for e in settlement["entries"]) == gross
    reputation = a.result("tenzro_moeReputation", {})["providers"]
    assert Decimal(next(r for r in reputation if r["provider_id"] == pid_b)["score"]) >= Decimal(
        holder_entry["amount"])

    # A dispute of an honest receipt: re-executed on a (fetching b's blob), dismissed; idempotent.
    receipt_id = receipts[0]["id"]
    opened = a.result("tenzro_moeDisputeReceipt", {"receipt_id": receipt_id}, token=TOKEN)
    assert opened["state"] in ("pending", "dismissed")

    cli = [sys.executable, "-m", "cli.main", "--node", a.url, "--token", TOKEN, "moe"]
    waited = subprocess.run([*cli, "dispute", "--receipt-id", str(receipt_id), "--wait"], capture_output=True,
                            text=True, timeout=90)
    assert waited.returncode == 0, waited.stderr
    dispute = json.loads(waited.stdout)
    assert dispute["state"] == "dismissed", dispute
    assert dispute["dispute_id"] == opened["dispute_id"] and dispute["signature_valid"] is True
    assert 0 <= dispute["difference"] <= dispute["tolerance"]
    again = a.result("tenzro_moeDisputeReceipt", {"receipt_id": receipt_id}, token=TOKEN)
    assert again == dispute
    assert a.result("tenzro_moeListReceipts", {"model_id": MODEL})["receipts"][-1]["dispute"] in (None, "dismissed")
    # Without the operator token a dispute is refused; an unknown receipt is named.
    assert a.rpc("tenzro_moeDisputeReceipt", {"receipt_id": receipt_id})["error"]["data"]["reason"] == "unauthorized"
    missing = a.rpc("tenzro_moeDisputeReceipt", {"receipt_id": 10**9}, token=TOKEN)
    assert missing["error"]["data"]["reason"] == "receipt_not_found"
