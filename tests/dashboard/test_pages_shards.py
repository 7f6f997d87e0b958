"""The shard map and dispatch pages: Django client (render, bounded queries, planning, live event)
and a real browser against real nodes (live redraw, holders on click, routings through the gate)."""

import base64
import json
import time

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from playwright.sync_api import expect

from apps.dashboard import services as dashboard_services
from apps.providers import services
from apps.providers.records import Holding as RecordHolding
from apps.providers.signals import holdings_changed
from testkit.nodes import TOKEN
from testkit.records import new_key, signed_record
from tests.dashboard.screens import shoot
from tests.dashboard.test_browser import page  # noqa: F401 (the fixture)
from tests.experts.factories import MODEL, expert_payload, expert_weights, qwen_gate


def _view(n_providers: int, *, first_key: int = 0) -> list[str]:
    """n providers, each holding layer i % 3, experts i % 8 and (i + 1) % 8 of MODEL."""
    now = services.now_ms()
    records = [signed_record(new_key(5000 + first_key + i), seq=now, at_ms=now,
                             holdings=(RecordHolding(MODEL, i % 3, i % 8, "Warm", 100 + i, None),
                                       RecordHolding(MODEL, i % 3, (i + 1) % 8, "Cold", 50, f"tenzro://blob/{i:064x}")))
               for i in range(n_providers)]
    services.gossip_receive(records=[r.envelope() for r in records], heartbeats=[])
    return [r.provider_id for r in records]


# -- Django client ----------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_pages_render_with_nothing_held(client) -> None:
    empty = client.get("/shardmap/")
    assert empty.status_code == 200 and empty.context["grid"] is None
    assert "no provider of the gossip view holds an expert" in empty.content.decode()
    assert client.get("/shardmap/?model=nobody/holds-this").context["grid"]["n_layers"] == 0
    assert client.get("/dispatch/").status_code == 200


@pytest.mark.django_db
def test_both_pages_render_and_are_in_the_navigation(client) -> None:
    _view(3)
    shard = client.get("/shardmap/")
    assert shard.status_code == 200
    body = shard.content.decode()
    assert 'href="/shardmap/"' in body and 'href="/dispatch/"' in body
    grid = shard.context["grid"]
    assert (grid["model_id"], grid["n_layers"], grid["n_experts"]) == (MODEL, 3, 4)  # experts 0..3 held
    assert 'id="shardmap-data"' in body
    assert client.get("/dispatch/").status_code == 200


@pytest.mark.django_db
def test_pages_need_a_login_unless_public(client, settings, django_user_model) -> None:
    settings.TENZRO_DASHBOARD_PUBLIC = False
    for url in ("/shardmap/", "/dispatch/", f"/shardmap/data.json?model={MODEL}"):
        assert client.get(url).status_code == 302
    client.force_login(django_user_model.objects.create_user("op", password="x"))
    assert client.get("/shardmap/").status_code == 200


@pytest.mark.django_db
def test_the_grid_counts_replication_and_flags_under_replicated_and_hot(client, settings) -> None:
    _view(3)  # layer 0: p0 holds 0,1; layer 1: p1 holds 1,2; layer 2: p2 holds 2,3
    grid = client.get(f"/shardmap/data.json?model={MODEL}").json()
    rep = np.array(grid["replication"]).reshape(3, 4)
    assert rep[0, 0] == rep[0, 1] == rep[1, 1] == rep[1, 2] == 1 and rep.sum() == 6
    assert [0, 3] in grid["under"] and len(grid["under"]) == 12  # min_replication 2: every cell
    assert grid["hot"] == []
    cell = client.get(f"/shardmap/cell.json?model={MODEL}&layer=1&expert=2").json()
    assert cell["replication"] == 1 and cell["holders"][0]["residency"] == "Cold"
    assert cell["holders"][0]["blob_uri"].startswith("tenzro://blob/")
    assert client.get(f"/shardmap/cell.json?model={MODEL}&layer=9&expert=9").json()["holders"] == []
    assert client.get("/shardmap/cell.json?model=x&layer=-1&expert=0").status_code == 400


@pytest.mark.django_db
def test_a_model_nobody_holds_is_named_in_the_picker_not_another_one(client) -> None:
    _view(3)
    html = client.get("/shardmap/", {"model": "nobody/holds-this"}).content.decode()
    assert '<option value="nobody/holds-this" selected>nobody/holds-this (nobody holds it)</option>' in html
    assert f'<option value="{MODEL}">' in html and f'<option value="{MODEL}" selected>' not in html


@pytest.mark.django_db
def test_the_shard_map_page_costs_the_same_queries_whatever_the_view(client) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def page_queries(n_providers: int) -> int:
        client.get(f"/shardmap/?model={MODEL}")  # warm: node identity and the like are read once per process
        with CaptureQueriesContext(connection) as queries:
            response = client.get(f"/shardmap/?model={MODEL}")
        assert response.status_code == 200 and response.context["grid"]["distinct_providers"] == n_providers
        return len(queries)

    _view(5)
    five = page_queries(5)
    _view(45, first_key=5)
    # models (gossiped, this node's), the shard index (policy, providers, reputation scores, holdings),
    # why this node announces nothing and its own holdings (four), the providers' names (one)
    assert page_queries(50) == five <= 11


@pytest.mark.django_db
def test_the_heatmap_data_costs_a_fixed_number_of_queries(client, django_assert_max_num_queries) -> None:
    _view(50)
    # the shard index (policy, providers, reputation scores, holdings) and why this node announces
    # nothing (reachability, worker state), then its own holdings (worker state, held experts)
    with django_assert_max_num_queries(8):
        assert client.get(f"/shardmap/data.json?model={MODEL}").status_code == 200


@pytest.mark.django_db
def test_hot_experts_are_flagged_per_the_active_policy(client) -> None:
    now = services.now_ms()
    hot = signed_record(new_key(7000), seq=now, at_ms=now, holdings=(RecordHolding(MODEL, 0, 1, "Warm", 1500, None),
                                                                    RecordHolding(MODEL, 0, 2, "Warm", 999, None)))
    services.gossip_receive(records=[hot.envelope()], heartbeats=[])
    grid = client.get(f"/shardmap/data.json?model={MODEL}").json()
    assert grid["policy"]["hot_threshold_tps"] == 1000.0 and grid["hot"] == [[0, 1]]


@pytest.mark.django_db
def test_a_dispatch_post_with_pasted_routings_shows_the_batches(client) -> None:
    ids = _view(3)
    routings = [{"token_index": t, "experts": [{"layer": 1, "expert": 1}, {"layer": 1, "expert": 2}]} for t in range(5)]
    response = client.post("/dispatch/", {"model_id": MODEL, "routings": json.dumps(routings), "action": "plan",
                                          "allow_cold": "on"})
    assert response.status_code == 200
    plan = response.context["plan"]
    assert [(b["layer"], b["expert"], b["provider"]) for b in plan["batches"]] == [(1, 1, ids[1]), (1, 2, ids[1])]
    assert response.context["summary"]["bars"] == [{"provider": ids[1], "tokens": 10, "batches": 2}]
    body = response.content.decode()
    assert 'id="batches"' in body and ids[1][:12] in body and "0, 1, 2, 3, 4" in body
    upload = SimpleUploadedFile("routings.json", json.dumps(routings[:2]).encode(), content_type="application/json")
    uploaded = client.post("/dispatch/", {"model_id": MODEL, "routings_file": upload, "action": "plan"})
    assert uploaded.status_code == 200 and uploaded.context["summary"]["tokens"] == 2
    bad = client.post("/dispatch/", {"model_id": MODEL, "routings": "[{", "action": "plan"})
    assert bad.status_code == 400 and "not JSON" in bad.content.decode()
    twice = client.post("/dispatch/", {"model_id": MODEL, "action": "plan", "routings": json.dumps(
        [{"token_index": 0, "experts": [{"layer": 0, "expert": 1}, {"layer": 0, "expert": 1}]}])})
    assert twice.status_code == 400


@pytest.mark.django_db
def test_the_dispatch_form_needs_csrf() -> None:
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    assert strict.post("/dispatch/", {"model_id": MODEL, "routings": "[]"}).status_code == 403


@pytest.mark.django_db
def test_a_merge_that_changes_holdings_announces_its_models_on_commit(django_capture_on_commit_callbacks,
                                                                      monkeypatch) -> None:
    pushed = []
    monkeypatch.setattr(dashboard_services, "dashboard_push", lambda **kw: pushed.append(kw))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        _view(2)
    assert pushed == []  # nothing before the commit
    for callback in callbacks:
        callback()
    assert [p for p in pushed if p["event"] == "shardmap.changed"] == [
        {"event": "shardmap.changed", "payload": {"model_ids": [MODEL]}}]
    received = []
    holdings_changed.connect(lambda **kw: received.append(kw["model_ids"]), weak=False, dispatch_uid="t")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.gossip_receive(records=[], heartbeats=[])  # no record: nothing changed, nothing sent
        assert received == []
    finally:
        holdings_changed.disconnect(dispatch_uid="t")


# -- a real browser against real nodes -----------------------------------------------------------

FAST = {"TENZRO_GOSSIP_INTERVAL_S": "1", "TENZRO_GOSSIP_HEARTBEAT_S": "1", "TENZRO_GOSSIP_TTL_S": "8",
        "TENZRO_REACHABILITY_CHECK_S": "30"}
D_MODEL, D_FF, N_ROUTED = 32, 16, 8


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _load(node, rng, expert: int) -> None:
    payload = expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=expert)
    node.result("tenzro_moeExpertLoad", {"payload": _b64(payload)}, token=TOKEN)


def _held(node) -> set[tuple[int, int]]:
    return {(e["layer"], e["expert"]) for e in node.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]}


def _wait(predicate, timeout_s: float, what: str, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def two_nodes(start_module_node):
    """a (the page's node, with the layer-0 gate) and b (holding experts 0..3 of layer 0), gossiping."""
    rng = np.random.default_rng(13)
    a = start_module_node(env=FAST)
    b = start_module_node(env=FAST, peers=[a.url])
    gate, _ = qwen_gate(rng, d_model=D_MODEL, n_routed=N_ROUTED, top_k=2, norm=True)
    a.result("tenzro_moeGateLoad", {"payload": _b64(gate)}, token=TOKEN)
    for expert in range(4):
        _load(b, rng, expert)
    _wait(lambda: {(0, e) for e in range(4)} <= _held(a), 60, "a to learn b's holdings")
    return a, b, rng


def _watch_errors(tab) -> list[str]:
    errors: list[str] = []
    # The browser's own favicon request 404s (base.html names no icon): not the page's error.
    tab.on("console", lambda msg: errors.append(f"{msg.text} ({msg.location.get('url')})")
           if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico") else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


@pytest.mark.e2e
@pytest.mark.browser
def test_a_holding_loaded_on_a_peer_appears_on_the_shard_map_live(two_nodes, page) -> None:  # noqa: F811
    a, b, rng = two_nodes
    pid_b = b.result("tenzro_nodeInfo")["provider_id"]
    errors = _watch_errors(page)
    page.goto(f"{a.url}/shardmap/?model={MODEL}")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    expect(page.locator('rect[data-cell="0-3"]')).to_have_attribute("data-replication", "1")
    assert page.locator('rect[data-cell="0-5"]').count() == 0  # the map is 1 layer x 4 experts so far
    expect(page.locator("#policy-min")).to_have_text("2")

    _load(b, rng, 5)
    _wait(lambda: (0, 5) in _held(a), 30, "a's own view to hold b's expert 5", every_s=0.05)
    # From when the page's node has it: no reload, the websocket event makes the page refetch.
    expect(page.locator('rect[data-cell="0-5"]')).to_have_attribute("data-replication", "1", timeout=2000)
    expect(page.locator('rect[data-cell="0-4"]')).to_have_attribute("data-replication", "0")

    page.locator('rect[data-cell="0-5"]').click()
    holder = page.locator("#cell-holders tbody tr")
    expect(holder).to_have_count(1)
    expect(holder).to_have_attribute("data-provider", pid_b)
    expect(holder.locator("td").nth(1)).to_have_text("Warm")
    expect(page.locator("#cell-expert")).to_have_text("5")
    shoot(page, "shardmap")
    assert errors == []


@pytest.mark.e2e
@pytest.mark.browser
def test_the_dispatch_page_generates_routings_through_the_gate_and_draws_the_plan(two_nodes, page) -> None:  # noqa: F811
    a, b, _ = two_nodes
    pid_b = b.result("tenzro_nodeInfo")["provider_id"]
    errors = _watch_errors(page)
    page.goto(f"{a.url}/dispatch/")
    page.fill("#model_id", MODEL)
    page.fill('input[name="tokens"]', "24")  # d_model left empty: read from the gate a holds
    page.click("#generate-button")
    expect(page.locator("#plan-summary")).to_contain_text("24 tokens (generated through the gate)")
    expect(page.locator("#plan-summary")).not_to_contain_text("1 holders")
    bars = page.locator("#chart svg g.bar")
    expect(bars.first).to_have_attribute("data-provider", pid_b)
    assert page.locator("#batches tbody tr").count() >= 1
    generated = json.loads(page.locator("#routings").input_value())
    assert len(generated) == 24 and all(len(r["experts"]) == 2 for r in generated)
    shoot(page, "dispatch")
    assert errors == []
