"""The node, network and runtime pages: server-rendered (Django test client, bounded queries), what
their services push on commit, and live in a real browser against real nodes (no polling)."""

from __future__ import annotations

import base64
import os
import signal

import httpx
import numpy as np
import pytest
from django.test import Client
from playwright.sync_api import expect

from apps.providers import services as provider_services
from apps.providers.records import Holding as RecordHolding
from apps.providers.selectors import liveness
from apps.worker import services as worker_services
from testkit.nodes import TOKEN
from testkit.records import heartbeat, new_key, signed_record
from tests.dashboard.screens import shoot
from tests.dashboard.test_browser import page  # noqa: F401  (the Playwright page fixture)
from tests.experts.factories import expert_payload, expert_weights

MODEL = "test/moe-tiny"
# Heartbeats every 2 s through gossip rounds every second, silent peers dropped after 10 s.
HEARTBEAT_S, TTL_S = 2, 10
LIVENESS_ENV = {"TENZRO_GOSSIP_INTERVAL_S": "1", "TENZRO_GOSSIP_HEARTBEAT_S": str(HEARTBEAT_S),
                "TENZRO_GOSSIP_TTL_S": str(TTL_S)}


def _gossip_providers(n: int) -> list[str]:
    now = provider_services.now_ms()
    envelopes, ids = [], []
    for seed in range(n):
        key = new_key(1000 + seed)
        holdings = tuple(RecordHolding(MODEL, 0, e, "Warm", 800, None) for e in range(seed % 3))
        envelopes.append(signed_record(key, seq=now, at_ms=now, holdings=holdings).envelope())
        ids.append(key.verify_key.encode().hex())
    for start in range(0, n, 20):  # a message carries a bounded number of records
        provider_services.gossip_receive(records=envelopes[start:start + 20], heartbeats=[])
    return ids


# -- Django test client ------------------------------------------------------------------------

@pytest.mark.django_db
def test_network_page_lists_every_provider_in_bounded_queries(django_assert_max_num_queries) -> None:
    ids = _gossip_providers(50)
    with django_assert_max_num_queries(6):
        response = Client().get("/network/")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("data-provider=") == 50
    for pid in ids[:3]:
        assert f'data-provider="{pid}"' in html
    assert 'href="/network/"' in html and 'href="/runtime/"' in html  # in the navigation


@pytest.mark.django_db
def test_network_rows_fragment_returns_only_the_asked_rows() -> None:
    ids = _gossip_providers(3)
    html = Client().get("/network/rows/", {"ids": ",".join(ids[:2]) + ",unknown"}).content.decode()
    assert html.count("data-provider=") == 2 and "<html" not in html


@pytest.mark.django_db
def test_a_gossip_merge_pushes_the_stored_ids_and_expiry_the_dropped_ones(
        pushed, settings, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        ids = _gossip_providers(2)
    changed = [p for e, p in pushed if e == "network.changed"]
    assert sorted(pid for p in changed for pid in p["changed"]) == sorted(ids)
    pushed.clear()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        provider_services.gossip_receive(records=[], heartbeats=[])  # nothing stored: nothing pushed
    assert (pushed, callbacks) == ([], [])
    # A heartbeat moves a provider's liveness without a new record: pushed too (the page's ages and
    # alive/suspect/dead were wrong without it), one push for the merge, by id.
    alive_ms = provider_services.now_ms() + 5
    beats = [heartbeat(new_key(1000 + seed), seq=seq, at_ms=alive_ms).to_json()
             for seed, seq in enumerate(_seqs(ids))]
    with django_capture_on_commit_callbacks(execute=True):
        provider_services.gossip_receive(records=[], heartbeats=beats)
    assert pushed == [("network.changed", {"changed": [], "removed": [], "alive": dict.fromkeys(ids, alive_ms)})]
    pushed.clear()
    settings.TENZRO_GOSSIP_TTL_S = -1  # everything is now too old
    with django_capture_on_commit_callbacks(execute=True):
        gone = provider_services.gossip_expire()
    assert sorted(gone) == sorted(ids)
    assert [p for p in pushed if p[0] == "network.changed"] == [
        ("network.changed", {"changed": [], "removed": sorted(ids), "alive": {}})]


def _seqs(ids: list[str]) -> list[int]:
    from apps.providers.models import Provider
    seq = dict(Provider.objects.filter(provider_id__in=ids).values_list("provider_id", "seq"))
    return [seq[pid] for pid in ids]


@pytest.mark.parametrize(("age_s", "state"), [(0, "alive"), (30, "alive"), (31, "suspect"), (59.9, "suspect"),
                                             (60, "dead")])
def test_liveness_states(age_s: float, state: str) -> None:
    assert liveness(age_s, heartbeat_s=15, ttl_s=60) == state


@pytest.mark.django_db
def test_a_worker_publish_and_heartbeat_push_the_runtime_status(pushed, django_capture_on_commit_callbacks) -> None:
    import datetime as dt
    status = {"experts": [{"model_id": MODEL, "layer": 0, "expert": 1, "tier": "memory", "memory_bytes": 10,
                           "disk_bytes": 20, "d_model": 4, "d_ff": 8, "formats": {"w1": "q8_0"}, "blob_uri": None}],
              "gates": [], "memory_budget_bytes": 100, "memory_used_bytes": 10, "committed_tps": 7,
              "capacity_tps": 70, "demand": [],
              "backend": "cpu", "cpu_kernel": "numpy", "gpu_backend_active": False}
    with django_capture_on_commit_callbacks(execute=True):
        worker_services.worker_state_publish(provider_id="p", pid=1, started_at=dt.datetime.now(dt.UTC),
                                             status=status)
        assert pushed == []  # nothing before the commit
    with django_capture_on_commit_callbacks(execute=True):
        worker_services.worker_state_heartbeat(pid=1, status={**status, "committed_tps": 9})
    runtime = [p for e, p in pushed if e == "runtime.status"]
    assert [r["committed_tps"] for r in runtime] == [7, 9]
    assert runtime[0]["experts"][0]["expert"] == 1


@pytest.mark.django_db
def test_runtime_page_renders_the_published_state() -> None:
    import datetime as dt
    status = {"experts": [{"model_id": MODEL, "layer": 2, "expert": 5, "tier": "disk", "memory_bytes": 0,
                           "disk_bytes": 2048, "d_model": 4, "d_ff": 8, "formats": {"w1": "q8_0"}, "blob_uri": None}],
              "gates": [], "memory_budget_bytes": 1000, "memory_used_bytes": 250, "committed_tps": 3,
              "capacity_tps": 30, "demand": [],
              "backend": "cpu", "cpu_kernel": "numpy", "gpu_backend_active": False}
    worker_services.worker_state_publish(provider_id="p", pid=1, started_at=dt.datetime.now(dt.UTC), status=status)
    html = Client().get("/runtime/").content.decode()
    assert 'data-key="test/moe-tiny/2/5"' in html and "25.0%" in html and 'id="runtime-initial"' in html
    assert '<dd id="device-memory">–</dd>' in html  # published before GPU backends existed: no compute

    device = {"kind": "wgsl", "name": "llvmpipe", "software": True, "state": "ok", "failed": None,
              "memory_total_bytes": None, "memory_budget_bytes": 2 << 30, "memory_used_bytes": 3 << 20, "experts": 4,
              "last_error": None, "counts": {}}
    compute = {"candidates": [{"name": "wgsl", "available": True, "active": True, "reason": "forced: llvmpipe"}],
               "device": device}
    worker_services.worker_state_publish(provider_id="p", pid=1, started_at=dt.datetime.now(dt.UTC),
                                         status={**status, "backend": "wgsl", "gpu_backend_active": True,
                                                 "compute": compute})
    html = Client().get("/runtime/").content.decode()
    assert '<dd id="backend-reason">forced: llvmpipe</dd>' in html
    assert '<dd id="device-memory">3.0\xa0MB of 2.0\xa0GB, 4 experts, ok</dd>' in html


@pytest.mark.django_db
def test_pages_need_login_when_the_dashboard_is_not_public(settings) -> None:
    settings.TENZRO_DASHBOARD_PUBLIC = False
    for path in ("/", "/network/", "/network/rows/", "/runtime/"):
        response = Client().get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), path


# -- real browser, real nodes ------------------------------------------------------------------

def _watch(page) -> tuple[list[str], list[str]]:  # noqa: F811
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    return errors, requests


@pytest.mark.e2e
@pytest.mark.browser
def test_node_page_process_list_is_pushed_not_polled(start_node, page) -> None:  # noqa: F811
    node = start_node()
    errors, requests = _watch(page)
    page.goto(node.url + "/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    up = page.locator('#processes tr[data-process="web"] td').nth(3)
    first = up.text_content()
    expect(up).not_to_have_text(first, timeout=15000)  # a node.processes push, no reload
    page.wait_for_timeout(6000)  # longer than the old 5 s poll
    # Processes and the runtime are never fetched; the gossip summary only after a network.changed push.
    polled = [u for u in requests if "/api/node/processes" in u or "/api/moe/status" in u]
    assert polled == [], polled
    shoot(page, "node")
    assert errors == [], errors


@pytest.mark.e2e
@pytest.mark.browser
def test_network_page_shows_a_joining_node_live_and_its_liveness(start_node, page) -> None:  # noqa: F811
    first = start_node(env=LIVENESS_ENV)
    errors, _ = _watch(page)
    page.goto(first.url + "/network/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    rows = page.locator("#providers tbody tr[data-provider]")
    before = rows.count()
    second = start_node(env=LIVENESS_ENV, peers=[first.url])
    second_id = second.result("tenzro_nodeInfo")["provider_id"]
    row = page.locator(f'#providers tr[data-provider="{second_id}"]')
    expect(row).to_have_count(1, timeout=45000)
    assert rows.count() >= max(before, 1)
    expect(row.locator("td").nth(2)).to_contain_text("127.0.0.1")
    # named as its record names it (the host name and the id's first hex digits by default), id on hover
    name = second.result("tenzro_nodeInfo")["name"]
    assert name.endswith("-" + second_id[:6])
    expect(row.locator(f'.provider[title="{second_id}"]')).to_contain_text(name)
    seen = {p["provider_id"]: p for p in first.result("tenzro_networkProviders")["providers"]}
    assert (seen[second_id]["name"], seen[second_id]["liveness"]) == (name, "alive")
    # Heartbeats are pushed: the age on the open page stays within two heartbeats (it counted up past
    # the TTL before, the page only hearing of new records), over eight heartbeats.
    ages = []
    for _ in range(8):
        page.wait_for_timeout(HEARTBEAT_S * 1000)
        ages.append(int(row.locator(".age").text_content().split()[0]))
        expect(row.locator(".liveness")).to_have_text("alive")
    assert max(ages) <= 2 * HEARTBEAT_S, ages
    shoot(page, "network")
    # A peer killed: suspect once two heartbeats are missed, dead at the TTL, without a reload.
    os.killpg(second.process.pid, signal.SIGKILL)
    expect(row.locator(".liveness")).to_have_text("suspect", timeout=int(4 * HEARTBEAT_S * 1000))
    expect(row.locator(".liveness")).to_have_text("dead", timeout=int(2 * TTL_S * 1000))
    assert errors == [], errors


@pytest.mark.e2e
@pytest.mark.browser
def test_runtime_page_shows_a_loaded_expert_live(start_node, page) -> None:  # noqa: F811
    node = start_node()
    errors, _ = _watch(page)
    page.goto(node.url + "/runtime/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    expect(page.locator("#runtime-experts tbody tr.empty")).to_have_count(1)
    rng = np.random.default_rng(0)
    payload = expert_payload(expert_weights(rng, 64, 32), expert=3, quant="q8_0")
    node.result("tenzro_moeExpertLoad", {"payload": base64.b64encode(payload).decode()}, token=TOKEN)
    row = page.locator("#runtime-experts tbody tr[data-key]")
    expect(row).to_have_count(1, timeout=15000)
    expect(row.locator("td").nth(2)).to_have_text("3")
    expect(row.locator("td").nth(3)).to_have_text("Warm (memory)")  # the node page's word, and the tier's
    expect(page.locator("#memory-pct")).to_have_text("<0.1%")  # kilobytes of a GiB budget are not "0%"
    expect(page.locator("#memory-used")).not_to_have_attribute("data-bytes", "0")
    # Heartbeats keep adding committed_tps points to the sparkline (every TENZRO_WORKER_HEARTBEAT_S).
    expect(row.locator("svg.spark")).to_have_attribute("data-points", "2", timeout=15000)
    # Each sparkline is its own expert's demand: traffic on expert 3 only moves expert 3's.
    payload = expert_payload(expert_weights(rng, 64, 32), expert=4, quant="q8_0")
    node.result("tenzro_moeExpertLoad", {"payload": base64.b64encode(payload).decode()}, token=TOKEN)
    hidden = base64.b64encode(rng.standard_normal((64, 64)).astype("<f4").tobytes()).decode()
    for _ in range(20):
        node.result("tenzro_moeExecute", {"model_id": MODEL, "layer": 0, "expert": 3, "d_model": 64, "hidden": hidden})
    busy, idle = (page.locator(f'#runtime-experts tr[data-key="{MODEL}/0/{e}"]') for e in (3, 4))
    expect(busy.locator(".tps")).not_to_have_text("0", timeout=20000)
    expect(idle.locator(".tps")).to_have_text("0")
    assert busy.locator("polyline").get_attribute("points") != idle.locator("polyline").get_attribute("points")
    shoot(page, "runtime")
    assert errors == [], errors


@pytest.mark.e2e
def test_anonymous_is_sent_to_login_when_the_dashboard_is_private(start_node) -> None:
    node = start_node(env={"TENZRO_DASHBOARD_PUBLIC": "0"})
    response = httpx.get(node.url + "/network/", follow_redirects=False)
    assert response.status_code == 302
    assert response.headers["location"].startswith("/accounts/login/?next=/network/")


def test_times_and_durations_read_as_people_say_them() -> None:
    import datetime as dt

    from django.utils import timezone

    from apps.dashboard.templatetags.readable import duration, when
    assert [duration(s) for s in (5, 115, 7260, 90000, None)] == ["5 s", "1 min 55 s", "2 h 1 min", "1 d 1 h", "–"]
    html = str(when(timezone.now() - dt.timedelta(seconds=130)))
    assert ">2 min ago</time>" in html and 'title="20' in html and " UTC" in html and "." not in html.split(">")[1]
