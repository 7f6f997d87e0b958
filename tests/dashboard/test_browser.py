"""The dashboard in a real browser (Debian's chromium driven by Playwright) against a real node."""

import base64
import shutil

import numpy as np
import pytest
from playwright.sync_api import expect, sync_playwright

from testkit.nodes import TOKEN
from tests.experts.factories import expert_payload, expert_weights

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Flags from the machine notes: no sandbox as root, and no background traffic to the internet.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def page():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context()
        yield context.new_page()
        browser.close()


def test_dashboard_shows_identity_processes_and_live_policy(start_node, page, tmp_path) -> None:
    node = start_node()
    info = node.result("tenzro_nodeInfo")
    page.goto(node.url + "/")
    expect(page.locator("#provider-id")).to_have_text(info["provider_id"])
    expect(page.locator("#node-name")).to_have_text(info["name"])  # what its record signs, for people
    expect(page.locator("#roles")).to_have_text("Router, ExpertHolder")
    for name in ("web", "expert-worker", "celery-worker", "celery-beat"):
        expect(page.locator(f'#processes tr[data-process="{name}"] td').nth(1)).to_have_text("running")
    expect(page.locator('#policy td[data-field="max_replication"]')).to_have_text("8")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)

    proposal = node.result("tenzro_policyPropose", {"changes": {"max_replication": 5}}, token=TOKEN)
    node.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)

    # No reload: the websocket delivers the change.
    expect(page.locator('#policy td[data-field="max_replication"]')).to_have_text("5", timeout=15000)
    expect(page.locator("#policy-id")).to_have_text(str(proposal["id"]))

    # The expert runtime card follows what the worker holds (polled every 5 s).
    rng = np.random.default_rng(0)
    payload = expert_payload(expert_weights(rng, 64, 32), expert=3, quant="q8_0")
    node.result("tenzro_moeExpertLoad", {"payload": base64.b64encode(payload).decode()}, token=TOKEN)
    row = page.locator("#experts tbody tr")
    expect(row).to_have_count(1, timeout=15000)
    expect(row.locator("td").nth(3)).to_have_text("Warm")
    expect(row.locator("td").nth(4)).to_have_text("Q8_0/Q8_0/Q8_0")
    expect(page.locator("#runtime-summary")).to_contain_text("1 warm, 0 cold experts")
    # A node alone: no peer can dial it back, so it says why it is not announced as a holder.
    expect(page.locator("#network-not-announced")).to_contain_text("no peer has dialed this node back",
                                                                    timeout=15000)
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
