"""Every dashboard page of a router in a three-node network carrying traffic, in a real browser.

a routes (the gate, no experts); b and c each hold the four experts of a prepared layer. A client
sends forwards through a; one of them while b's expert worker is stopped (SIGSTOP), so c wins
hedges against b's stalled batches; governance asks for a third copy of every expert, which
nobody can take, so b's repair pass lists them as unrepairable. Then every page is opened (a's,
but for b's prepare and repair pages: b prepared and holds the experts), checked for overflow at
1280 and 390 px and photographed, and the reasons behind the numbers (a stall that a hedge raced
out, why an expert cannot be repaired) must be on the page.
`make screenshots` keeps these photographs in docs/screenshots/.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from playwright.sync_api import expect

from apps.repair.selectors import UNREPAIRABLE_MEANING
from testkit.nodes import TOKEN
from tests.dashboard.screens import shoot
from tests.dashboard.test_browser import page  # noqa: F401  (the fixture: a real chromium)
from tests.e2e.test_gossip import FAST, wait_for
from tests.e2e.test_prepare_blobs import MODEL, router_and_two_holders
from tests.e2e.test_receipts import forward

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
# A stalled batch is raced out after 0.3 s (until a holder's own p95 is known) rather than the
# default's wait: the stopped worker costs the forward a fraction of a second, not seconds.
ROUTER_ENV = {**FAST, "TENZRO_ROLES": "Router", "TENZRO_FORWARD_HEDGE_DEFAULT_S": "0.3"}
PAGES = (("node", "a", "/"), ("network", "a", "/network/"), ("runtime", "a", "/runtime/"),
         ("shardmap", "a", f"/shardmap/?model={MODEL}"), ("dispatch", "a", "/dispatch/"),
         ("forwards", "a", "/forwards/"), ("receipts", "a", "/receipts/"), ("prepare", "b", "/prepare/"),
         ("repair", "b", "/repair/"))


def _policy(node, **changes) -> None:
    proposal = node.result("tenzro_policyPropose", {"changes": changes}, token=TOKEN)
    node.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)


def test_every_page_of_a_router_in_a_network_with_traffic(start_node, page, tmp_path) -> None:  # noqa: F811
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"{m.text} ({m.location.get('url')})") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    a, b, _, _ = router_and_two_holders(start_node, tmp_path, holder_env=FAST, router_env=ROUTER_ENV)
    for node in (a, b):
        _policy(node, receipt_sample_one_in=1, min_replication=3)
    wait_for(lambda: [len(e["holders"]) for e in a.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]]
             == [2] * 4, 90, "a to see b and c holding every expert")

    rng = np.random.default_rng(11)
    for _ in range(6):  # traffic; the router learns both holders' latencies
        forward(a, rng.standard_normal((16, 64)).astype(np.float32))
    worker = b.result("tenzro_workerStatus")["pid"]
    os.kill(worker, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 60
        while True:  # until a forward planned a batch on b (not cooling down) and raced it out
            stats = forward(a, rng.standard_normal((16, 64)).astype(np.float32))["stats"]
            if any(f["reason"] == "stalled" for f in stats["failures"]) or time.monotonic() > deadline:
                break
    finally:
        os.kill(worker, signal.SIGCONT)
    assert stats["hedges_won"] >= 1 and {f["reason"] for f in stats["failures"]} == {"stalled"}, stats
    for _ in range(4):
        forward(a, rng.standard_normal((16, 64)).astype(np.float32))

    b.result("tenzro_moeRepairRun", token=TOKEN)
    wait_for(lambda: any(p["unrepairable_count"] for p in b.result("tenzro_moeRepairPasses", {})["passes"]), 90,
             "a repair pass of b's that finds the third copies nobody can take (a holds no experts)")

    nodes = {"a": a, "b": b}
    for name, node, path in PAGES:
        page.goto(nodes[node].url + path)
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
        if name == "forwards":  # the stall is named, and that a hedge raced it out
            expect(page.locator("#forwards")).to_contain_text("stalled, hedged")
        if name == "repair":  # why the pass could not repair
            expect(page.locator("main")).to_contain_text(UNREPAIRABLE_MEANING["no_candidate"])
        shoot(page, f"tour-{name}", docs_name=name)
    assert errors == [], errors
