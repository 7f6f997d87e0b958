"""The work pages (receipts and disputes, prepare jobs, forwards, repair passes): rendered by the
Django client, refused to anonymous and CSRF-less POSTs, and what they push live on commit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.catalog.models import PrepareJob
from apps.catalog.services import _push_progress
from apps.forward.models import ForwardRecord
from apps.forward.services import forward_stats_record
from apps.receipts import services as receipts_services
from apps.receipts.models import Dispute
from testkit.checkpoints import FileServer, qwen3_moe
from testkit.nodes import TOKEN
from tests.dashboard.screens import shoot
from tests.dashboard.test_browser import page  # noqa: F401  (the fixture: a real chromium)
from tests.e2e.test_gossip import FAST, wait_for
from tests.e2e.test_prepare_blobs import MODEL, prepare
from tests.e2e.test_receipts import forward
from tests.receipts.test_disputes import _kept, _store_expert

PAGES = ("/receipts/", "/prepare/", "/forwards/", "/repair/")
JOB = {"model_id": "m", "layer": "0", "experts": "0-2,5", "quant": "q8_0", "checkpoint": "/nowhere"}


@pytest.fixture
def receipt():
    from nacl.signing import SigningKey
    payload, uri = _store_expert()
    return _kept(SigningKey(bytes([3]) * 32), payload, uri, seed=3)


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES)
def test_each_page_renders_publicly_and_behind_login_when_not_public(client, settings, path) -> None:
    assert client.get(path).status_code == 200
    settings.TENZRO_DASHBOARD_PUBLIC = False  # read per request
    answer = client.get(path)
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES)
def test_pages_make_a_bounded_number_of_queries(operator, receipt, django_assert_max_num_queries, path) -> None:
    for i in range(10):  # enough rows that a query per row would show
        forward_stats_record(forward_id=f"f{i}", model_id="m", tokens=1, stats={"holders": []}, missing=0)
        operator.post("/prepare/start/", JOB)
    with django_assert_max_num_queries(8):  # session, user, and at most one query per table shown
        assert operator.get(path).status_code == 200


@pytest.mark.django_db
def test_receipts_page_filters_and_lists_ledger_and_reputation(client, receipt) -> None:
    html = client.get("/receipts/", {"model": receipt.model_id, "expert": receipt.expert}).content.decode()
    assert f'data-receipt="{receipt.pk}"' in html
    assert 'class="dispute-form' not in html  # anonymous: no button
    for miss in ({"model": "other"}, {"expert": receipt.expert + 1}, {"holder": "f" * 64}):
        assert f'data-receipt="{receipt.pk}"' not in client.get("/receipts/", miss).content.decode()
    assert 'id="ledger"' in html and 'id="reputation"' in html
    from decimal import Decimal

    from apps.reputation.services import reputation_penalize
    reputation_penalize(provider_id="b" * 64, amount=Decimal(1), reason="timeout", ref="penalty:page")
    assert "b" * 64 in client.get("/receipts/").content.decode()
    narrowed = client.get("/receipts/", {"holder": "a" * 64}).content.decode()  # the filter narrows it too
    assert "b" * 64 not in narrowed and "No reputation events yet." in narrowed


@pytest.mark.django_db
def test_receipts_are_paged_newest_first_keeping_the_filter(client, receipt, monkeypatch) -> None:
    from nacl.signing import SigningKey
    payload, uri = _store_expert()
    newer = _kept(SigningKey(bytes([4]) * 32), payload, uri, seed=4)
    monkeypatch.setattr("apps.dashboard.pages_work.RECEIPTS_SHOWN", 1)
    first = client.get("/receipts/", {"model": receipt.model_id}).content.decode()
    assert f'data-receipt="{newer.pk}"' in first and f'data-receipt="{receipt.pk}"' not in first
    assert f'href="?model={receipt.model_id}&amp;page=2" rel="next"' in first and 'rel="prev"' not in first
    second = client.get("/receipts/", {"model": receipt.model_id, "page": 2}).content.decode()
    assert f'data-receipt="{receipt.pk}"' in second and f'data-receipt="{newer.pk}"' not in second
    assert 'rel="prev"' in second and 'rel="next"' not in second


@pytest.mark.django_db
def test_the_ledger_and_the_reputation_page_on_their_own(client, monkeypatch) -> None:
    from decimal import Decimal

    from apps.reputation.services import reputation_penalize
    from apps.settlement.services import settlement_record
    for n, pid in enumerate(("b" * 64, "c" * 64, "d" * 64)):  # three holders, three scores
        reputation_penalize(provider_id=pid, amount=Decimal(n + 1), reason="timeout", ref=f"penalty:{n}")
    settlement_record(forward_id="f-pages", router_id="a" * 64, model_id="m",
                      holders=[{"provider_id": pid, "tokens": 10, "price_per_input_token": "0.001",
                                "commitments": ["e" * 64]} for pid in ("b" * 64, "c" * 64)])
    monkeypatch.setattr("apps.dashboard.pages_work.LEDGER_SHOWN", 2)
    monkeypatch.setattr("apps.dashboard.pages_work.REPUTATION_SHOWN", 2)

    def table(html: str, name: str) -> str:
        return html.split(f'id="{name}"')[1].split("</table>")[0]

    first = client.get("/receipts/", {"model": "m"}).content.decode()
    assert "b" * 64 in table(first, "reputation") and "d" * 64 not in table(first, "reputation")  # highest first
    assert 'href="?model=m&amp;reputation_page=2" rel="next"' in first
    assert 'href="?model=m&amp;ledger_page=2" rel="next"' in first
    second = client.get("/receipts/", {"model": "m", "reputation_page": 2, "ledger_page": 2}).content.decode()
    assert "d" * 64 in table(second, "reputation") and "b" * 64 not in table(second, "reputation")
    ledger_rows = table(first, "ledger").count("<tr>") - 1, table(second, "ledger").count("<tr>") - 1
    assert ledger_rows[0] == 2 and ledger_rows[1] >= 1  # router, holders, burn: more than one page of 2
    # each list's links keep the other's page
    assert 'href="?model=m&amp;ledger_page=2&amp;reputation_page=1" rel="prev"' in second


@pytest.mark.django_db
def test_anonymous_and_non_staff_cannot_dispute_or_start_a_job(client, receipt, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as queued:
        answer = client.post(f"/receipts/{receipt.pk}/dispute/")
        assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")
        answer = client.post("/prepare/start/", JOB)
        assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")
        client.force_login(User.objects.create_user("viewer", password="pw"))
        assert client.post(f"/receipts/{receipt.pk}/dispute/").status_code == 403
        assert client.post("/prepare/start/", JOB).status_code == 403
    assert queued == [] and not Dispute.objects.exists() and not PrepareJob.objects.exists()


@pytest.mark.django_db
def test_a_post_without_csrf_token_is_refused() -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.create_user("op", password="pw", is_staff=True))
    assert strict.post("/prepare/start/", JOB).status_code == 403
    assert not PrepareJob.objects.exists()
    token = strict.get("/prepare/").cookies["csrftoken"].value
    assert strict.post("/prepare/start/", {**JOB, "csrfmiddlewaretoken": token}).status_code == 302
    assert PrepareJob.objects.get().experts == [0, 1, 2, 5]


@pytest.mark.django_db
def test_an_operator_opens_a_dispute_and_its_verdict_is_pushed_on_commit(
        operator, receipt, pushed, django_capture_on_commit_callbacks) -> None:
    assert 'class="dispute-form' in operator.get("/receipts/").content.decode()
    with django_capture_on_commit_callbacks() as queued:
        answer = operator.post(f"/receipts/{receipt.pk}/dispute/", HTTP_ACCEPT="application/json")
    assert answer.status_code == 200 and answer.json()["state"] == "pending" and len(queued) == 1  # the task
    assert operator.post(f"/receipts/{10**9}/dispute/", HTTP_ACCEPT="application/json").status_code == 404
    with django_capture_on_commit_callbacks(execute=True):
        decided = receipts_services.dispute_run(dispute_id=answer.json()["dispute_id"])
    assert pushed == [("receipts.dispute", {"receipt_id": receipt.pk, "state": "dismissed",
                                            "difference": decided.difference, "tolerance": decided.tolerance})]


@pytest.mark.django_db
def test_an_operator_starts_a_job_and_its_progress_is_pushed_coalesced(
        operator, pushed, settings, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=False) as queued:
        answer = operator.post("/prepare/start/", JOB, HTTP_ACCEPT="application/json")
    assert answer.status_code == 201 and answer.json()["progress"] == {"done": 0, "total": 4}
    assert len(queued) == 2  # the Celery task and the push, both after commit
    bad = operator.post("/prepare/start/", {**JOB, "experts": "x"}, HTTP_ACCEPT="application/json")
    assert bad.status_code == 400 and "experts" in bad.json()["errors"]
    job = PrepareJob.objects.get()
    settings.TENZRO_PREPARE_PUSH_INTERVAL_S = 60.0
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(50):  # a progress write per expert of a big job
            _push_progress(job)
        _push_progress(job, force=True)  # a state change always goes
    assert [event for event, _ in pushed] == ["prepare.progress", "prepare.progress"]
    assert pushed[0][1]["job"]["job_id"] == str(job.pk)


@pytest.mark.django_db
def test_forwards_are_recorded_capped_and_pushed(client, pushed, settings, django_capture_on_commit_callbacks):
    settings.TENZRO_FORWARD_RECORDS_KEPT = 3
    stats = {"elapsed_ms": 12.5, "batches": 2, "retries": 1, "replans": 0, "hedges_fired": 1, "hedges_won": 1,
             "failures": [{"provider": "b" * 64, "reason": "stalled", "layer": 0, "expert": 5, "rows": 2},
                          {"provider": "c" * 64, "reason": "deadline_exceeded", "layer": 0, "expert": 1, "rows": 1}],
             "holders": [{"provider": "a" * 64, "latency_ms_median": 3.0, "latency_ms_max": 4.0, "failures": 0}]}
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(5):
            forward_stats_record(forward_id=f"f{i}", model_id="m", tokens=4, stats=stats, missing=i % 2)
    assert list(ForwardRecord.objects.values_list("forward_id", flat=True)) == ["f4", "f3", "f2"]
    assert [p["forward"]["forward_id"] for _, p in pushed] == [f"f{i}" for i in range(5)]
    assert pushed[1][1]["forward"]["ok"] is False
    html = client.get("/forwards/").content.decode()
    assert 'data-forward="f4"' in html and 'data-forward="f0"' not in html and "3.0 / 4.0 ms" in html
    # what each survived failure was: a stall is the hedge working (fired 1, won 1), the other a retry
    assert "<td>1 / 1</td>" in html and "0/5: <span" in html and "stalled, hedged" in html
    assert '<span class="warn">deadline_exceeded</span>, retried' in html
    # filtered (f3 failed closed, f4 answered) and paged, the filter kept across pages
    failed = client.get("/forwards/", {"result": "failed"}).content.decode()
    assert 'data-forward="f3"' in failed and 'data-forward="f4"' not in failed
    second = client.get("/forwards/", {"model": "m", "page": 2}).content.decode()
    assert "page 2" in second and 'href="?model=m&amp;page=1" rel="prev"' in second


# --- In a real browser against real nodes --------------------------------------------------------



def _superuser(node, username: str, password: str) -> None:
    """An operator account in the node's own database (the node's data dir names its SQLite file)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tenzro_site.settings.base", "TENZRO_DATA_DIR": str(node.data_dir),
           "DJANGO_SUPERUSER_USERNAME": username, "DJANGO_SUPERUSER_PASSWORD": password,
           "DJANGO_SUPERUSER_EMAIL": f"{username}@example.invalid"}
    done = subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput"], env=env,
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.e2e
@pytest.mark.browser
def test_work_pages_live_in_a_browser(start_node, page, tmp_path) -> None:  # noqa: F811
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"{m.text} ({m.location.get('url')})") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    model = qwen3_moe(tmp_path / "ckpt", d_model=64, d_ff=32, n_experts=4)
    with FileServer(model.root) as server:
        b = start_node(env=FAST)
        # Every progress write pushed (no coalescing), so the bar is seen between 0 and done.
        a = start_node(env={**FAST, "TENZRO_PREPARE_PUSH_INTERVAL_S": "0"}, peers=[b.url])
        job = prepare(b, experts=[0, 1, 2, 3], quant="q8_0", checkpoint=server.url)
    assert job["state"] == "done", job
    for entry in job["experts"]:
        b.result("tenzro_moeExpertLoad", {"blob_uri": entry["blob_uri"]}, token=TOKEN)
    a.result("tenzro_moeGateLoad", {"blob_uri": job["gate"]["blob_uri"]}, token=TOKEN)
    proposal = a.result("tenzro_policyPropose", {"changes": {"receipt_sample_one_in": 1}}, token=TOKEN)
    a.result("tenzro_policyApprove", {"policy_id": proposal["id"]}, token=TOKEN)
    pid_b = b.result("tenzro_nodeInfo")["provider_id"]
    wait_for(lambda: len(a.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]) == 4, 60, "b's experts")
    _superuser(a, "operator", "s3cret-pass")

    # Anonymous: every page renders, no mutating control is offered.
    for path in ("/receipts/", "/prepare/", "/forwards/", "/repair/"):
        page.goto(a.url + path)
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    expect(page.locator("#prepare-form")).to_have_count(0)

    page.goto(a.url + "/forwards/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    hidden = np.random.default_rng(5).standard_normal((12, 64)).astype(np.float32)
    deadline = time.monotonic() + 30
    while True:  # the worker reads the 1-in-1 policy through a short-TTL view
        result = forward(a, hidden)
        if a.result("tenzro_moeListReceipts", {"model_id": MODEL})["total"] >= result["stats"]["batches"] \
                or time.monotonic() > deadline:
            break
        time.sleep(1)
    # The forward arrived live, with b's latency.
    row = page.locator(f'#forwards tr[data-forward="{result["stats"]["forward_id"]}"]')
    expect(row).to_have_count(1, timeout=15000)
    expect(row.locator("td").nth(9).locator(f'.provider[title="{pid_b}"]')).to_have_count(1)
    shoot(page, "forwards")

    # Log in through the form, then open a dispute from the receipts page: the verdict arrives live.
    page.goto(a.url + "/accounts/login/?next=/receipts/")
    page.fill('input[name="username"]', "operator")
    page.fill('input[name="password"]', "s3cret-pass")
    page.click('#login-form button[type="submit"]')
    page.wait_for_url(a.url + "/receipts/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    first = page.locator("#receipts tbody tr").first
    receipt_id = first.get_attribute("data-receipt")
    first.locator("form.dispute-form button").click()
    expect(page.locator(f'#receipts tr[data-receipt="{receipt_id}"] td.dispute')).to_have_text("dismissed",
                                                                                                 timeout=90000)
    expect(page.locator("#reputation tbody tr")).not_to_have_count(0)
    shoot(page, "receipts")

    # A prepare job started from the form: its bar advances to done, its blob URIs can be copied.
    page.goto(a.url + "/prepare/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    page.evaluate("""() => { window.progressSeen = [];
        new MutationObserver(() => document.querySelectorAll('#jobs progress').forEach(
          p => window.progressSeen.push(p.value + '/' + p.max))).observe(document.getElementById('jobs'),
          {subtree: true, childList: true, attributes: true, characterData: true}); }""")
    page.fill('input[name="model_id"]', MODEL)
    page.fill('input[name="layer"]', "1")
    page.fill('input[name="experts"]', "0-3")
    page.select_option('select[name="quant"]', "q8_0")
    page.fill('input[name="checkpoint"]', str(model.root))
    page.click('#prepare-form button[type="submit"]')
    card = page.locator("#jobs article.job").first
    expect(card.locator(".job-state")).to_have_text("done", timeout=90000)
    expect(card.locator(".job-count")).to_have_text("4 / 4")
    assert card.locator("progress").evaluate("p => p.value === p.max && p.max === 4")
    seen = page.evaluate("window.progressSeen")
    assert any(v.split("/")[0] not in ("0", "4") for v in seen), seen  # seen between start and done
    expect(card.locator("ul.blobs li")).to_have_count(5)  # the gate and four experts
    card.locator("button.copy").first.click()
    expect(card.locator("button.copy").first).not_to_have_text("copy")  # "copied" or the fallback's hint
    # Place: this node loads its share of the job's experts and the gate (tenzro_moePlace); again: all held
    card.locator("form.place-form button").click()
    expect(card.locator(".place-result")).to_contain_text("here:", timeout=60000)
    expect(card.locator(".place-result")).to_have_attribute("data-outcome", "ok")
    assert "loaded" in card.locator(".place-result").inner_text()
    card.locator("form.place-form button").click()
    expect(card.locator(".place-result")).to_contain_text("held", timeout=60000)
    assert "loaded" not in card.locator(".place-result").inner_text()
    shoot(page, "prepare")

    page.goto(a.url + "/repair/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    shoot(page, "repair")
    assert errors == [], errors
