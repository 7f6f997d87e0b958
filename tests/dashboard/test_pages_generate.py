"""The generate page (/generate/): rendered by the Django client (the form for operators only, errors
in plain words, bounded queries), what generation pushes on commit, and in a real browser against a
real node holding the whole tiny Qwen3-MoE fixture: the tokens arrive live and equal transformers'."""

from __future__ import annotations

import html as html_text
import json
import shutil
from pathlib import Path

import msgpack
import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.generation import services as generation_services
from apps.generation.models import Generation
from apps.serving.services import key_create, key_used
from core.errors import NotFound, RateLimited
from testkit.holdings import load_every_expert
from testkit.nodes import TOKEN
from testkit.text_files import write_text_files
from tests.dashboard.screens import shoot
from tests.dashboard.test_browser import page  # noqa: F401  (the fixture: a real chromium)
from tests.dashboard.test_pages_work import _superuser
from tests.e2e.test_forward import ENV
from tests.e2e.test_gossip import wait_for

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "generation" / "qwen3_moe"
MODEL = "test/gen-qwen3-moe"
FORM = {"model_id": MODEL, "prompt_ids": "97, 47, 42", "max_new_tokens": "4", "wire": "f32"}
OPTIONS = {"allow_partial": False, "wire": "f32", "stop_at_eos": True}


@pytest.fixture
def begun(monkeypatch):
    """What the page asked the worker to start (the expert worker is not running here)."""
    calls: list[dict] = []

    async def begin(params):
        calls.append(params.model_dump(exclude_none=True))
        return "a" * 32

    monkeypatch.setattr("apps.dashboard.pages_generate.generation_begin", begin)
    return calls


def _step(index: int, token: int) -> dict:
    holders = [{"provider": "b" * 64, "transport": "local", "rows": 3, "batches": 1},
               {"provider": "c" * 64, "transport": "quic", "rows": 1, "batches": 1}]
    return {"index": index, "phase": "prefill" if index == 0 else "decode", "tokens_in": 3 if index == 0 else 1,
            "token": token, "ms": 4.5, "layers": [{"layer": layer, "ms": 1.25, "lost_gate_mass": 0.0, "missing": 0,
                                                  "failures": 0, "holders": holders} for layer in (0, 1, 2)]}


def _generation(generation_id: str = "g" * 32, tokens: tuple[int, ...] = (239, 247)) -> None:
    generation_services.generation_start(generation_id=generation_id, model_id=MODEL, prompt_ids=[97, 47, 42],
                                         max_new_tokens=4, options=OPTIONS)
    for i, token in enumerate(tokens):
        generation_services.generation_step(generation_id=generation_id, step=_step(i, token),
                                            ttft_ms=12.5 if i == 0 else None)
    generation_services.generation_finish(generation_id=generation_id, decode_tokens_per_s=40.0)


@pytest.mark.django_db
def test_the_page_renders_publicly_without_a_form_and_behind_login_when_not_public(client, settings) -> None:
    html = client.get("/generate/").content.decode()
    assert 'id="generate-form"' not in html and 'id="generate-login-hint"' in html
    assert 'href="/generate/"' in html  # in the navigation
    settings.TENZRO_DASHBOARD_PUBLIC = False
    for path in ("/generate/", "/generate/data.json?id=x"):
        answer = client.get(path)
        assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")


@pytest.mark.django_db
def test_anonymous_and_non_staff_cannot_start_a_generation(client, begun) -> None:
    answer = client.post("/generate/start/", FORM)
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")
    client.force_login(User.objects.create_user("viewer", password="pw"))
    assert client.post("/generate/start/", FORM).status_code == 403
    assert 'id="generate-form"' not in client.get("/generate/").content.decode()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.create_user("op", password="pw", is_staff=True))
    assert strict.post("/generate/start/", FORM).status_code == 403  # no CSRF token
    assert begun == []


@pytest.mark.django_db
def test_an_operator_starts_a_generation_through_the_rpcs_schema(operator, begun) -> None:
    assert 'id="generate-form"' in operator.get("/generate/").content.decode()
    answer = operator.post("/generate/start/", {**FORM, "allow_partial": "on"})
    assert answer.status_code == 302 and answer["Location"] == "/generate/?id=" + "a" * 32
    answer = operator.post("/generate/start/", {**FORM, "wire": ""}, HTTP_ACCEPT="application/json")
    assert answer.status_code == 201 and answer.json() == {"generation_id": "a" * 32}
    assert begun == [{"model_id": MODEL, "prompt_ids": [97, 47, 42], "max_new_tokens": 4, "allow_partial": True,
                      "wire": "f32", "stop_at_eos": True, "wait": False},
                     {"model_id": MODEL, "prompt_ids": [97, 47, 42], "max_new_tokens": 4, "allow_partial": False,
                      "stop_at_eos": True, "wait": False}]


@pytest.mark.django_db
def test_client_keys_usage_is_shown_to_operators_only(operator) -> None:
    row, _ = key_create(name="laptop")
    key_used(key_id=row.id, prompt_tokens=12, completion_tokens=34, request=True)
    html = operator.get("/generate/").content.decode()
    assert f'data-prefix="{row.prefix}"' in html and "<td>12</td>" in html and "<td>34</td>" in html
    assert 'id="client-keys"' not in Client().get("/generate/").content.decode()  # anonymous: not shown


@pytest.mark.django_db
def test_a_text_prompt_or_a_chat_turn_goes_through_the_same_schema(operator, begun) -> None:
    text = {**FORM, "prompt_ids": "", "prompt": "ba be\nbi", "temperature": "0.7"}
    assert operator.post("/generate/start/", text).status_code == 302
    assert operator.post("/generate/start/", {**text, "as_chat": "on", "temperature": ""}).status_code == 302
    assert begun == [{"model_id": MODEL, "prompt": "ba be\nbi", "sampling": {"temperature": 0.7, "use_model_defaults":
                      False}, "max_new_tokens": 4, "allow_partial": False, "wire": "f32", "stop_at_eos": True,
                      "wait": False},
                     {"model_id": MODEL, "messages": [{"role": "user", "content": "ba be\nbi"}], "max_new_tokens": 4,
                      "allow_partial": False, "wire": "f32", "stop_at_eos": True, "wait": False}]


@pytest.mark.django_db
@pytest.mark.parametrize(("form", "message"), [
    ({"prompt_ids": "97, x"}, "'x' is not a token id"),
    ({"prompt_ids": " , "}, "give at least one token id"),
    ({"prompt": "ba"}, "give a prompt as text or as token ids"),
    ({"max_new_tokens": "0"}, "Max new tokens"),
    ({"model_id": ""}, "Model: This field is required."),
])
def test_a_bad_form_is_refused_in_plain_words(operator, begun, form, message) -> None:
    answer = operator.post("/generate/start/", {**FORM, **form})
    assert answer.status_code == 400 and message in html_text.unescape(answer.content.decode())
    answer = operator.post("/generate/start/", {**FORM, **form}, HTTP_ACCEPT="application/json")
    assert answer.status_code == 400 and message in answer.json()["message"]
    assert begun == []


@pytest.mark.django_db
@pytest.mark.parametrize("error", [
    NotFound("this router holds no dense weights of 'm': load them first", reason="dense_not_loaded"),
    RateLimited("2 generations are running on this router", reason="busy"),
])
def test_the_workers_refusal_is_shown(operator, monkeypatch, error) -> None:
    async def refuse(params):
        raise error

    monkeypatch.setattr("apps.dashboard.pages_generate.generation_begin", refuse)
    answer = operator.post("/generate/start/", FORM)
    assert answer.status_code == error.http_status and error.message in html_text.unescape(answer.content.decode())
    answer = operator.post("/generate/start/", FORM, HTTP_ACCEPT="application/json")
    assert answer.json() == {"reason": error.reason, "message": error.message}


@pytest.mark.django_db
def test_each_step_is_pushed_on_commit_ready_for_the_channel_layer(pushed, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        _generation()
    assert [event for event, _ in pushed] == ["generation.progress"] * 4  # start, two steps, finish
    views = [payload["generation"] for _, payload in pushed]
    assert [v["step"] and v["step"]["index"] for v in views] == [None, 0, 1, None]
    assert [v["tokens"] for v in views] == [[], [239], [239, 247], [239, 247]]
    assert views[-1]["state"] == "done" and "steps" not in views[-1]
    for _, payload in pushed:  # channels_redis sends msgpack: no datetimes
        assert msgpack.unpackb(msgpack.packb(payload)) == payload


@pytest.mark.django_db
def test_a_generation_is_rendered_with_its_fan_out(client, django_assert_max_num_queries) -> None:
    _generation()
    for i in range(10):  # rows enough that a query per row would show
        _generation(f"{i:032d}", tokens=(5,))
    with django_assert_max_num_queries(6):  # the generation, its steps, recent rows, models, the shard map, names
        html = client.get("/generate/", {"id": "g" * 32}).content.decode()
    assert 'data-generation="' + "g" * 32 + '"' in html
    assert '<code class="tok">239</code> <code class="tok">247</code>' in html
    assert "12.5 ms" in html and "40.0 tokens/s" in html
    assert html.count('<details class="step"') == 2 and html.count('class="holder" data-layer="2"') == 4
    assert html.count("<tr data-generation=") == 11
    data = client.get("/generate/data.json", {"id": "g" * 32}).json()
    assert data["tokens"] == [239, 247] and len(data["steps"]) == 2
    assert client.get("/generate/data.json", {"id": "nope"}).status_code == 404
    assert "no generation 'nope'" in html_text.unescape(client.get("/generate/", {"id": "nope"}).content.decode())
    assert Generation.objects.count() == 11


# --- In a real browser against a real node -------------------------------------------------------

def _load_everything(node, checkpoint: Path = FIXTURE) -> list[int]:
    """Every expert of every MoE layer (f32) on the node, then the dense part (from `checkpoint`: the
    fixture, or a copy with the text files of a hub checkpoint); the MoE layers."""
    shape = load_every_expert(node, FIXTURE, MODEL)
    loaded = node.result("tenzro_moeLoadDense", {"model_id": MODEL, "checkpoint": str(checkpoint)}, token=TOKEN)
    assert loaded["moe_layers"] == list(shape.moe_layers)
    n = shape.n_experts_total * len(shape.moe_layers)
    wait_for(lambda: len(node.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]) == n, 60,
             "the node to see its own experts")
    return list(shape.moe_layers)


def _submit(tab, prompt: str, max_new: int, *, model: str = MODEL, text: str = "") -> None:
    tab.fill('input[name="model_id"]', model)
    tab.fill('textarea[name="prompt_ids"]', prompt)
    tab.fill('textarea[name="prompt"]', text)
    tab.fill('input[name="max_new_tokens"]', str(max_new))
    tab.select_option('select[name="wire"]', "f32")
    tab.click('#generate-form button[type="submit"]')


@pytest.mark.e2e
@pytest.mark.browser
def test_generate_page_live_in_a_browser(start_node, page, tmp_path) -> None:  # noqa: F811
    errors: list[str] = []
    refusals = "/generate/start/"  # the refused prompts below answer 400/404 on purpose; nothing else may fail
    page.on("console", lambda m: errors.append(f"{m.text} ({m.location.get('url')})")
            if m.type == "error" and not m.location.get("url", "").endswith(refusals) else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}")
            if r.status >= 400 and not r.url.endswith(refusals) else None)
    meta = json.loads((FIXTURE / "expected.json").read_text())
    # Every step written as it ends (the default batches them every 0.25 s, longer than this tiny
    # model's whole generation): the page must show them arrive one by one.
    node = start_node(env={**ENV, "TENZRO_GENERATION_RECORD_INTERVAL_S": "0"})
    # A second node that holds nothing: a lone node announces no holdings until a peer has dialed it
    # back (apps.providers.selectors.announcement), so the router would not see its own experts.
    start_node(env=ENV, peers=[node.url])
    checkpoint = tmp_path / "checkpoint"  # the fixture with a tokenizer and a chat template beside it
    checkpoint.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, checkpoint / name)
    tokenizer = write_text_files(checkpoint, vocab_size=256)
    moe_layers = _load_everything(node, checkpoint)
    _superuser(node, "operator", "s3cret-pass")

    # Anonymous: the page renders live, offers no form, and a POST starts nothing.
    page.goto(node.url + "/generate/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    expect(page.locator("#generate-form")).to_have_count(0)
    expect(page.locator("#generate-login-hint")).to_be_visible()
    refused = page.request.post(node.url + "/generate/start/", form={"model_id": MODEL, "prompt_ids": "1"},
                                max_redirects=0)
    assert refused.status in (302, 403), refused.status
    assert node.result("tenzro_moeGenerations", {})["generations"] == []

    page.goto(node.url + "/accounts/login/?next=/generate/")
    page.fill('input[name="username"]', "operator")
    page.fill('input[name="password"]', "s3cret-pass")
    page.click('#login-form button[type="submit"]')
    page.wait_for_url(node.url + "/generate/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15000)
    expect(page.locator('datalist#generate-models option[value="' + MODEL + '"]')).to_have_count(1)

    # Bad prompts are refused in plain words: by the form, and by the worker (outside the vocabulary).
    _submit(page, "97, x", 4)
    expect(page.locator("#generate-error")).to_contain_text("'x' is not a token id")
    _submit(page, "300, 1", 4)
    expect(page.locator("#generate-error")).to_contain_text("prompt_ids[0] = 300 is not a token id of this model")
    _submit(page, "1", 4, model="test/not-loaded")
    expect(page.locator("#generate-error")).to_contain_text("holds no dense weights of 'test/not-loaded'")

    # The fixture's prompt: the tokens arrive one by one over the websocket, no reload, no polling.
    page.evaluate("""() => { window.stayed = true; window.counts = [];
        new MutationObserver(() => window.counts.push(document.querySelectorAll('#gen-tokens code.tok').length))
          .observe(document.getElementById('gen-tokens'), {childList: true}); }""")
    data_reads: list[str] = []
    page.on("request", lambda r: data_reads.append(r.url) if "/generate/data.json" in r.url else None)
    n = len(meta["greedy_ids"])
    _submit(page, ", ".join(map(str, meta["prompt_ids"])), n)
    expect(page.locator("#gen-state")).to_have_text("done", timeout=120000)
    expect(page.locator("#gen-tokens code.tok")).to_have_count(n)
    assert [int(t) for t in page.locator("#gen-tokens code.tok").all_text_contents()] == meta["greedy_ids"]
    assert page.evaluate("window.stayed") is True
    counts = page.evaluate("window.counts")
    assert len(set(counts)) > 2, counts  # not all at once: step by step
    assert len(data_reads) <= 2, data_reads  # the record once on select (and once if the socket reconnected)
    expect(page.locator("#gen-ttft")).to_contain_text(" ms")
    expect(page.locator("#gen-rate")).to_contain_text(" tokens/s")
    expect(page.locator("#gen-count")).to_have_text(f"{n} / {n}")
    expect(page.locator("#gen-text")).to_have_text(tokenizer.decode(meta["greedy_ids"], skip_special_tokens=True))
    expect(page.locator("#gen-finish")).to_have_text("length")
    # The live view of continuous batching: pushed once no generation runs, a bar per iteration (one a step)
    expect(page.locator("#batch-running")).to_have_text("0 of 16")
    expect(page.locator("#batch-bars span")).to_have_count(n)
    assert set(page.locator("#batch-bars span").evaluate_all("bars => bars.map(b => b.dataset.batch)")) == {"1"}
    expect(page.locator("#batch-rate")).to_contain_text("(last 10 s)")
    # Each step's fan-out: at least one holder row per MoE layer, this node's short id among them.
    layers = page.evaluate("""() => Array.from(document.querySelectorAll('#gen-steps details.step')).map(
        d => Array.from(new Set(Array.from(d.querySelectorAll('tr.holder')).map(tr => Number(tr.dataset.layer)))))""")
    assert layers == [moe_layers] * n, layers
    provider = node.result("tenzro_nodeInfo")["provider_id"]
    # the holder by its name, its whole id on hover
    expect(page.locator("#gen-steps details.step").last.locator("tr.holder .provider").first).to_have_attribute(
        "title", provider)
    generation_id = page.locator("#generation").get_attribute("data-generation")
    assert page.url.endswith("/generate/?id=" + generation_id)
    expect(page.locator(f'#generations tr[data-generation="{generation_id}"] td').nth(3)).to_have_text("done")
    shoot(page, "generate", docs_name="generate")

    # Reloaded: the same record rendered by the server.
    page.reload()
    expect(page.locator("#gen-tokens code.tok")).to_have_count(n)
    expect(page.locator("#gen-steps details.step")).to_have_count(n)

    # Text in: the same prompt as words, encoded by the model's tokenizer; the text shows as it grows.
    _submit(page, "", 4, text=tokenizer.decode(meta["prompt_ids"]))
    expect(page.locator("#gen-state")).to_have_text("done", timeout=120000)
    expect(page.locator("#gen-text")).to_have_text(tokenizer.decode(meta["greedy_ids"][:4], skip_special_tokens=True))
    expect(page.locator("#gen-prompt")).to_have_text(", ".join(map(str, meta["prompt_ids"])), use_inner_text=False)
    _submit(page, "1, 2", 4, text="both")
    expect(page.locator("#generate-error")).to_contain_text("give a prompt as text or as token ids")
    assert errors == [], errors
