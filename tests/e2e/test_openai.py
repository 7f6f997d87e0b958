"""The OpenAI-compatible API, driven by OpenAI's own Python client, over two real nodes on loopback.

Node a is the router (the dense part, the gates, the tokenizer and chat template of the Qwen3-MoE
fixture, whose text files the test kit writes beside the checkpoint); node b holds every expert, so
each MoE layer of each step crosses the network. The reference for temperature 0 is transformers:
the fixture's greedy ids (its `generate`), decoded by transformers' tokenizer; the chat prompt's ids
are its apply_chat_template's.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import prepare_layer
from testkit.nodes import TOKEN, NodeProcess
from testkit.text_files import write_text_files
from tests.e2e.test_forward import ENV
from tests.e2e.test_generate import MODELS, long_generation_router
from tests.e2e.test_gossip import wait_for

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.e2e
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "generation" / "qwen3_moe"
MODEL = "test/chat-qwen3-moe"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
MESSAGES = [{"role": "system", "content": "ba be"}, {"role": "user", "content": "bi bo bu da"}]
UNHELD = "test/chat-unheld"
CLIENTS = 16  # the router's TENZRO_GENERATE_MAX_CONCURRENT here: all step together


@pytest.fixture(scope="module")
def served(start_module_node, tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoint")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, folder / name)
    write_text_files(folder, vocab_size=256)
    a = start_module_node(env={**ENV, "TENZRO_GENERATE_MAX_CONCURRENT": str(CLIENTS), "TENZRO_GENERATE_QUEUE": "0"})
    b = start_module_node(env=ENV, peers=[a.url])
    with CheckpointReader.open(folder) as reader:
        shape = shape_from_config(MODEL, reader.config)
        for layer in shape.moe_layers:
            prepared = prepare_layer(reader, shape, model_id=MODEL, layer=layer, experts=range(shape.n_experts_total),
                                     quant=None)  # f32 experts: the same sums as transformers
            for payload in prepared.experts.values():
                b.result("tenzro_moeExpertLoad", {"payload": base64.b64encode(payload).decode()}, token=TOKEN)
    n = shape.n_experts_total * len(shape.moe_layers)
    wait_for(lambda: len(a.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]) == n, 90,
             "the router to see every expert")
    loaded = a.result("tenzro_moeLoadDense", {"model_id": MODEL, "checkpoint": str(folder)}, token=TOKEN)
    assert loaded["text"] and loaded["chat_template"] and loaded["context_length"] == 256
    # The same checkpoint under a model id nobody holds experts of: its layers cannot be served.
    a.result("tenzro_moeLoadDense", {"model_id": UNHELD, "checkpoint": str(folder)}, token=TOKEN)
    key = a.result("tenzro_keysCreate", {"name": "tests"}, token=TOKEN)["key"]
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    return a, key, reference


def client(node: NodeProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key=key, max_retries=0, timeout=120)


def record(node: NodeProcess, response_id: str, steps: bool = False) -> dict:
    """The generation's record once it has ended: the worker writes steps off the decode path, so the
    answer can reach the client a flush before the record holds its last tokens (docs/openai.md "Streaming")."""
    generation_id = response_id.split("-", 1)[1]
    return wait_for(lambda: (g := node.result("tenzro_moeGeneration", {"generation_id": generation_id,
                                                                        "steps": steps}))["state"] != "running" and g,
                    30, "the generation's record to end")


def test_models_lists_what_the_router_can_generate(served) -> None:
    a, key, _ = served
    assert MODEL in [m.id for m in client(a, key).models.list().data]


def test_a_completion_at_temperature_zero_is_transformers_text(served) -> None:
    a, key, reference = served
    prompt = reference.decode(EXPECTED["prompt_ids"])
    assert reference(prompt).input_ids == EXPECTED["prompt_ids"]
    want = reference.decode(EXPECTED["greedy_ids"], skip_special_tokens=True)
    answer = client(a, key).completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    assert answer.choices[0].text == want and answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (8, 16)
    assert record(a, answer.id)["tokens"] == EXPECTED["greedy_ids"]

    chunks = list(client(a, key).completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == want and sum(bool(t) for t in texts) >= 8  # token by token, not at the end
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 16


def test_sixteen_streaming_clients_at_once_share_iterations_and_each_gets_its_text(served) -> None:
    """Continuous batching through /v1: the clients' generations step together (one MoE round per layer
    per iteration for all of them), and each streams the text it gets alone."""
    a, key, reference = served
    prompt = reference.decode(EXPECTED["prompt_ids"])
    lengths = [8 + i % 5 for i in range(CLIENTS)]
    alone = {n: client(a, key).completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0)
             .choices[0].text for n in set(lengths)}

    def stream(n: int) -> tuple[str, str]:
        chunks = list(client(a, key).completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0,
                                                        stream=True))
        return chunks[0].id, "".join(c.choices[0].text for c in chunks if c.choices)

    with ThreadPoolExecutor(CLIENTS) as pool:
        streamed = list(pool.map(stream, lengths))
    assert [text for _, text in streamed] == [alone[n] for n in lengths]
    batches = [layer["batch"] for response_id, _ in streamed
               for step in record(a, response_id, steps=True)["steps"]
               for layer in step["layers"]]
    # at least a quarter of the clients in one iteration: on a loaded 2-core machine the 16 client
    # threads start staggered and the short generations of the first ones end before the last join
    # (CI saw 7); without continuous batching every iteration would carry one generation
    assert max(batches) >= CLIENTS // 4, batches


def test_a_chat_renders_the_template_and_streams(served) -> None:
    a, key, reference = served
    want_ids = reference.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    want_ids = list(getattr(want_ids, "input_ids", want_ids))
    whole = client(a, key).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    assert record(a, whole.id)["prompt_ids"] == want_ids
    message = whole.choices[0].message
    assert message.role == "assistant" and message.content == reference.decode(record(a, whole.id)["tokens"],
                                                                               skip_special_tokens=True)
    stream = client(a, key).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0,
                                                    stream=True)
    deltas = [c.choices[0].delta for c in stream]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == message.content


def test_a_seed_repeats_and_stop_strings_cut(served) -> None:
    a, key, _ = served
    ask = client(a, key).chat.completions.create
    runs = [ask(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=1.0, top_p=0.9, seed=7).choices[0]
            .message.content for _ in range(2)]
    assert runs[0] == runs[1] and runs[0]
    full = ask(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0).choices[0].message.content
    words = full.split(" ")
    stop = " ".join(words[2:4])  # two words in the middle: matched across token boundaries
    cut = ask(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0, stop=[stop]).choices[0]
    assert cut.message.content == full[: full.index(stop)] and cut.finish_reason == "stop"
    logprobs = ask(model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = logprobs.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert all(t.token == t.top_logprobs[0].token for t in content)  # greedy: the most likely one


def test_a_client_that_leaves_mid_stream_cancels_its_generation(start_node, tmp_path) -> None:
    # A generation of thousands of tokens (the module's model has 256 positions, which a fast machine decodes
    # before a cancel through a loaded web process lands): the cancel must come before its end.
    max_tokens = 4000
    node, key = long_generation_router(start_node, tmp_path, max_tokens)
    body = {"model": MODELS["qwen3_moe"], "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{node.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        next(line for line in lines if '"content":"' in line and '"content":""' not in line)  # a token arrived
    done = record(node, first["id"])
    assert done["state"] == "cancelled" and done["finish_reason"] == "cancelled"
    assert 0 < len(done["tokens"]) < max_tokens


@pytest.mark.parametrize("body, status, param", [
    ({"model": "no/such-model", "messages": MESSAGES}, 404, None),
    ({"model": MODEL, "messages": []}, 400, "messages"),
    ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, 400, "messages"),
    ({"model": MODEL, "messages": MESSAGES, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "messages": MESSAGES, "max_tokens": 10_000}, 400, "max_tokens"),
    ({"model": MODEL, "messages": MESSAGES, "temperature": -1}, 400, "temperature"),
    ({"model": MODEL, "messages": MESSAGES, "n": 2}, 400, "n"),
    ({"model": MODEL, "prompt": "ba " * 300}, 400, "prompt"),  # longer than the model's context
])
def test_bad_requests_get_openai_errors_and_leave_nothing_running(served, body, status, param) -> None:
    a, key, _ = served
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    answer = httpx.post(f"{a.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == ("invalid_request_error" if status in (400, 404) else error["type"])
    if param:
        assert error["param"] == param, error
    if status == 404:
        assert error["code"] == "model_not_found"
    assert not [g for g in a.result("tenzro_moeGenerations")["generations"] if g["state"] == "running"]


def test_a_busy_router_answers_429_with_retry_after_and_a_network_that_cannot_serve_503(served) -> None:
    a, key, _ = served
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 200, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http:
        streams = [http.stream("POST", f"{a.url}/v1/chat/completions", json=body, headers=headers)
                   for _ in range(CLIENTS)]
        try:
            for stream in streams:  # TENZRO_GENERATE_MAX_CONCURRENT (CLIENTS) generations running, each read
                assert stream.__enter__().status_code == 200
            busy = http.post(f"{a.url}/v1/chat/completions", json={**body, "stream": False}, headers=headers)
            assert busy.status_code == 429 and int(busy.headers["Retry-After"]) >= 1
            assert busy.json()["error"]["code"] == "server_busy"
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)  # the clients leave: their generations are cancelled
    wait_for(lambda: not [g for g in a.result("tenzro_moeGenerations")["generations"] if g["state"] == "running"],
             30, "the cancelled generations to end")
    unheld = httpx.post(f"{a.url}/v1/chat/completions", json={"model": UNHELD, "messages": MESSAGES, "max_tokens": 2},
                        headers=headers, timeout=60)
    assert unheld.status_code == 503, unheld.text
    error = unheld.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "forward_incomplete" and "expert" in error["message"]


def test_keys_malformed_json_and_the_rate_limit(served) -> None:
    a, key, _ = served
    url = f"{a.url}/v1/chat/completions"
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
    assert httpx.post(url, json=body, timeout=30).status_code == 401  # no key
    wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer sk-tz-not-a-key"}, timeout=30)
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).status_code == 401
    bad = httpx.post(url, content=b'{"model": ', headers={"Authorization": f"Bearer {key}",
                                                          "Content-Type": "application/json"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["message"]
    limited = a.result("tenzro_keysCreate", {"name": "slow", "requests_per_minute": 2}, token=TOKEN)
    minute = int(time.time() // 60)
    statuses = [httpx.post(url, json=body, headers={"Authorization": f"Bearer {limited['key']}"}, timeout=60)
                for _ in range(3)]
    if int(time.time() // 60) == minute:  # all three in one minute window
        assert [s.status_code for s in statuses] == [200, 200, 429]
        assert int(statuses[2].headers["Retry-After"]) > 0 and statuses[2].json()["error"]["type"] == "rate_limit_error"
    used = {k["prefix"]: k for k in a.result("tenzro_keysList", token=TOKEN)["keys"]}[limited["prefix"]]
    assert used["requests"] >= 2 and used["completion_tokens"] >= 2 and used["prompt_tokens"] > 0
    a.result("tenzro_keysRevoke", {"prefix": limited["prefix"]}, token=TOKEN)
    revoked = httpx.post(url, json=body, headers={"Authorization": f"Bearer {limited['key']}"}, timeout=30)
    assert revoked.status_code == 401


def test_the_cli_generates_text_and_manages_keys(served) -> None:
    a, _, reference = served
    cli = [sys.executable, "-m", "cli.main", "--node", a.url, "--token", TOKEN]
    prompt = reference.decode(EXPECTED["prompt_ids"])
    done = subprocess.run([*cli, "moe", "generate", "--model", MODEL, "--prompt", prompt, "--max-new-tokens", "16",
                           "--wire", "f32"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == reference.decode(EXPECTED["greedy_ids"], skip_special_tokens=True)
    assert "16 tokens, length" in done.stderr
    chat = subprocess.run([*cli, "moe", "generate", "--model", MODEL, "--chat", "bi bo", "--max-new-tokens", "4",
                           "--json"], capture_output=True, text=True, timeout=120)
    record = json.loads(chat.stdout)
    assert record["prompt_ids"][:2] == [2, 5] and record["finish_reason"] in ("length", "stop")  # <|im_start|>user
    made = json.loads(subprocess.run([*cli, "keys", "create", "--name", "cli"], capture_output=True, text=True,
                                     timeout=60).stdout)
    assert made["key"].startswith("sk-tz-") and made["key"].startswith(made["prefix"])
    listed = json.loads(subprocess.run([*cli, "keys", "list"], capture_output=True, text=True, timeout=60).stdout)
    assert made["prefix"] in [k["prefix"] for k in listed["keys"]]
    assert all("key" not in k and "key_hash" not in k for k in listed["keys"])
    revoked = json.loads(subprocess.run([*cli, "keys", "revoke", made["prefix"]], capture_output=True, text=True,
                                        timeout=60).stdout)
    assert revoked["revoked_at"] is not None
