"""The README's quick start from top to bottom, as a new operator runs it: the `tenzro` CLI only, on three real nodes.

Three nodes started by `tenzro node run` (testkit NodeProcess), each with its own generated operator
token in its data dir, which the CLI reads as the README says (TENZRO_NODE + TENZRO_DATA_DIR). A tiny
whole Qwen3-MoE (testkit.checkpoints.qwen3_moe_whole: d_model = d_ff = 256, so q4_k_m really stores
Q4_K/Q6_K blocks; 4 experts, top-2, 2 layers, vocabulary 64) is served over HTTP with Range
(FileServer). The walkthrough: catalog-shape → prepare-experts --wait (layer 0 q4_k_m, layer 1
q8_0) → place both jobs on the three nodes (replication 2 by the rendezvous rule; the gates on A),
twice: the second run changes nothing → status → shard-map until every expert shows replication 2
and none is uncovered → plan-dispatch from a routings file → forward hidden.f32 → combined.f32 →
load-dense → generate. Every CLI answer is
parsed and checked; a failing call prints its stderr and the nodes' logs.

References, in this process: the same prepare code on the same checkpoint gives byte-identical
blobs (their BLAKE3 must equal the URIs the CLI printed), loaded into an ExpertRuntime (the node's
compute backend) whose forward_local is the reference forward, and the MoE callback of a local
WholeModel from the same checkpoint: the network's greedy tokens (--wire f32) must equal that local
greedy generation over the same quantized experts (not the f32 model's tokens: quantization moves
the logits). The reference's top-1 margins are printed; the smallest is ~0.035 against f32
summation-order differences of ~1e-6.

At the end no node's log holds its operator token or its node key.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from apps.blobs.store import blob_hash, parse_blob_uri
from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import prepare_layer
from apps.generation.model import WholeModel
from apps.generation.spec import spec_from_config
from apps.generation.weights import load_dense_weights
from apps.repair.selection import placement
from core.experts.runtime import ExpertRuntime
from testkit.checkpoints import FileServer, qwen3_moe_whole
from testkit.nodes import NodeProcess, free_port
from tests.e2e.test_gossip import FAST

try:  # issue 15's security review adds it; until then _assert_no_secrets_here below
    from testkit.secrets import assert_no_secrets
except ImportError:
    assert_no_secrets = None

pytestmark = pytest.mark.e2e

MODEL = "walkthrough/qwen3-moe-tiny"
D_MODEL, N_EXPERTS, TOP_K = 256, 4, 2
QUANT = {0: "q4_k_m", 1: "q8_0"}  # per layer: both presets of the seed's story
FORMATS = {"q4_k_m": {"gate": "Q4_K", "up": "Q4_K", "down": "Q6_K"},
           "q8_0": {"gate": "Q8_0", "up": "Q8_0", "down": "Q8_0"}}
PROMPT, NEW_TOKENS = [3, 14, 15, 9, 26], 6
BUDGET = 64 << 20
# The nodes generate their own operator tokens (TENZRO_OPERATOR_TOKEN unset): the CLI reads them
# from the data dir, as on an operator's machine.
NODE_ENV = {**FAST, "TENZRO_OPERATOR_TOKEN": "", "TENZRO_MEMORY_BUDGET_BYTES": str(BUDGET)}
TENZRO = Path(sys.executable).with_name("tenzro")  # the console script setup.py installs
NOISE = re.compile(r"gossip_round|processes_announce|node\.heartbeat|Sending due task|Native peer close")


class Operator:
    """Runs `tenzro …` as a subprocess against one node, as an operator's shell would."""

    def __init__(self, nodes: list[NodeProcess]) -> None:
        self.nodes = nodes
        self.timings: list[tuple[str, float]] = []

    def env(self, node: NodeProcess) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "TENZRO_OPERATOR_TOKEN"}
        return {**env, "TENZRO_NODE": node.url, "TENZRO_DATA_DIR": str(node.data_dir)}

    def logs(self) -> str:
        """Each node's log without the periodic task chatter, the last 6000 characters."""
        def tail(node: NodeProcess) -> str:
            return "\n".join(line for line in node.log().splitlines() if not NOISE.search(line))[-6000:]

        return "\n".join(f"---- log of node {i} ({n.url}):\n{tail(n)}" for i, n in enumerate(self.nodes))

    def text(self, node: NodeProcess, *args: str, timeout: float = 120) -> str:
        """What `tenzro …` printed; the test fails with its stderr and the logs when it exits non-zero."""
        argv = [str(TENZRO), *args] if TENZRO.exists() else [sys.executable, "-m", "cli.main", *args]
        done = subprocess.run(argv, env=self.env(node), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            pytest.fail(f"`tenzro {' '.join(args)}` against {node.url} exited {done.returncode}\n"
                        f"stderr:\n{done.stderr}\nstdout:\n{done.stdout[-2000:]}\n{self.logs()}")
        return done.stdout

    def __call__(self, node: NodeProcess, *args: str, timeout: float = 120) -> dict:
        out = self.text(node, *args, timeout=timeout)
        try:
            return json.loads(out)
        except ValueError:
            pytest.fail(f"`tenzro {' '.join(args)}` printed no JSON:\n{out[-2000:]}")

    def many(self, calls: list[tuple[NodeProcess, tuple[str, ...]]]) -> list[dict]:
        """Several calls, one shell per node at once (each node's calls in order); answers in call order."""
        by_node: dict[str, list[int]] = {}
        for index, (node, _) in enumerate(calls):
            by_node.setdefault(node.url, []).append(index)
        answers: list[dict] = [{}] * len(calls)

        def run(indices: list[int]) -> None:
            for index in indices:
                node, args = calls[index]
                answers[index] = self(node, *args)

        with ThreadPoolExecutor(len(by_node) or 1) as pool:
            list(pool.map(run, by_node.values()))  # list(): re-raise a failed call here
        return answers

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        self.timings.append((name, time.monotonic() - started))

    @contextlib.contextmanager
    def logs_on_failure(self) -> Iterator[None]:
        try:
            yield
        except AssertionError:
            print(self.logs())
            raise


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Iterator[tuple[Path, str]]:
    root = qwen3_moe_whole(tmp_path_factory.mktemp("walkthrough") / "ckpt").root
    with FileServer(root) as server:
        yield root, server.url


@pytest.fixture(scope="module")
def nodes(start_module_node) -> Iterator[list[NodeProcess]]:
    """Three nodes started at once (b and c know a): start-up and shut-down are mostly waiting, not CPU."""
    a_port = free_port(socket.SOCK_STREAM)
    peers = [[], [f"http://127.0.0.1:{a_port}"], [f"http://127.0.0.1:{a_port}"]]
    with ThreadPoolExecutor(3) as pool:
        trio = list(pool.map(lambda i: start_module_node(env=NODE_ENV, peers=peers[i],
                                                         **({"http_port": a_port} if i == 0 else {})), range(3)))
        yield trio
        list(pool.map(NodeProcess.stop, trio))  # start_module_node's own teardown then finds them stopped


@pytest.fixture(scope="module")
def reference(checkpoint, tmp_path_factory) -> dict:
    """What the nodes must reproduce, computed here by the project's own code on the same checkpoint."""
    root, _ = checkpoint
    runtime = ExpertRuntime(data_dir=tmp_path_factory.mktemp("reference"), memory_budget_bytes=BUDGET)
    hashes: dict[tuple[int, int], str] = {}
    gates: dict[int, str] = {}
    with CheckpointReader.open(root) as reader:
        shape = shape_from_config(MODEL, reader.config)
        for layer, quant in QUANT.items():
            prepared = prepare_layer(reader, shape, model_id=MODEL, layer=layer, experts=range(N_EXPERTS),
                                     quant=quant)
            runtime.gate_load(payload=prepared.gate_payload)
            gates[layer] = blob_hash(prepared.gate_payload)
            for expert, payload in prepared.experts.items():
                runtime.expert_load(payload=payload)
                hashes[(layer, expert)] = blob_hash(payload)
        model = WholeModel(load_dense_weights(reader, spec_from_config(reader.config, model_id=MODEL)))

    def moe(layer: int, x: np.ndarray) -> np.ndarray:
        return runtime.forward_local(model_id=MODEL, layer=layer, hidden=x)

    tokens, margins = [], []
    cache, ids = model.new_cache(), np.array(PROMPT)
    for _ in range(NEW_TOKENS):  # greedy_generate, keeping each step's top-1 margin
        logits = model.forward(ids, cache, moe, last_only=True)[-1]
        assert np.isfinite(logits).all()
        top = np.sort(logits)
        margins.append(float(top[-1] - top[-2]))
        tokens.append(int(np.argmax(logits)))
        ids = np.array(tokens[-1:])
    print(f"reference greedy tokens {tokens}, top-1 margins {[round(m, 4) for m in margins]}")
    return {"runtime": runtime, "hashes": hashes, "gates": gates, "tokens": tokens}


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def prepare_all(op: Operator, a: NodeProcess, url: str) -> dict[int, dict]:
    """prepare-experts --wait for both layers, then prepare-status of each (done)."""
    jobs = {}
    for layer, quant in QUANT.items():
        job = op(a, "moe", "prepare-experts", "--model-id", MODEL, "--layer", str(layer),
                 "--experts", ",".join(map(str, range(N_EXPERTS))), "--quant", quant, "--checkpoint", url, "--wait",
                 timeout=180)
        assert job["state"] == "done" and job["progress"]["total"] == N_EXPERTS, job
        jobs[layer] = job
    for layer, job in jobs.items():
        assert op(a, "moe", "prepare-status", "--job-id", job["job_id"]) == job
        assert job["state"] == "done" and job["error"] is None, job
        assert job["progress"] == {"done": N_EXPERTS, "total": N_EXPERTS}
        assert [e["expert"] for e in job["experts"]] == list(range(N_EXPERTS))
        assert all(e["formats"] == FORMATS[QUANT[layer]] for e in job["experts"]), job["experts"]
        jobs[layer] = job
    return jobs


def check_status(i: int, status: dict, uris: dict, holders: dict, backend: str) -> None:
    """`tenzro moe status` of node i: what it holds, each Warm in memory, the budget, the backend."""
    held = sorted((r["layer"], r["expert"]) for r in status["experts"])
    assert held == sorted(k for k in uris if i in holders[k]), (i, held)
    for r in status["experts"]:
        formats = {f"{p}_proj": t for p, t in FORMATS[QUANT[r["layer"]]].items()}  # tensor names here
        assert (r["residency"], r["tier"], r["formats"]) == ("Warm", "memory", formats), r
        assert r["memory_bytes"] > 0 and r["d_model"] == D_MODEL and r["blob_uri"] == uris[(r["layer"], r["expert"])]
    assert status["memory_budget_bytes"] == BUDGET
    assert sum(r["memory_bytes"] for r in status["experts"]) <= status["memory_used_bytes"] <= BUDGET
    assert status["gpu_backend_active"] is False and status["backend"] == backend  # the reference's backend
    assert status["counts"] == {"warm": len(held), "cold": 0, "gates": 2 if i == 0 else 0}


def wait_for_replication(op: Operator, a: NodeProcess, want: dict) -> dict:
    """`tenzro moe shard-map` until gossip has brought every holder's record to a."""
    deadline = time.monotonic() + 60
    while True:
        shard = op(a, "moe", "shard-map", "--model", MODEL)
        seen = {(h["layer"], h["expert"]): sorted(x["provider"] for x in h["holders"]) for h in shard["holders"]}
        if seen == want:
            return shard
        assert time.monotonic() < deadline, f"the shard map never showed replication 2: {seen} != {want}"
        time.sleep(0.5)


def test_the_operator_walkthrough(nodes, checkpoint, reference, tmp_path) -> None:
    op = Operator(nodes)
    a = nodes[0]
    _, url = checkpoint
    with op.logs_on_failure():
        with op.step("catalog-shape"):  # from the checkpoint's config.json: the model is not in the catalog
            shape = op(a, "moe", "catalog-shape", "--model", MODEL, "--checkpoint", url)
        assert (shape["family"], shape["n_routed_experts"], shape["n_active"], shape["moe_layers"],
                shape["d_model"], shape["expert_d_ff"]) == ("qwen3_moe", N_EXPERTS, TOP_K, [0, 1], D_MODEL, 256)

        with op.step("prepare-experts, prepare-status"):
            jobs = prepare_all(op, a, url)
        uris = {(layer, e["expert"]): e["blob_uri"] for layer, job in jobs.items() for e in job["experts"]}
        # the same code here gives byte-identical blobs: content addressing makes them checkable
        assert {k: parse_blob_uri(u) for k, u in uris.items()} == reference["hashes"]
        assert {layer: parse_blob_uri(job["gate"]["blob_uri"]) for layer, job in jobs.items()} == reference["gates"]

        providers = [op(n, "node", "info")["provider_id"] for n in nodes]
        # Who holds what: repair's rendezvous rule over the three, two holders each (the policy's min_replication)
        holders = {(layer, e): [providers.index(p) for p in placement(MODEL, layer, e, providers, 2)]
                   for layer, e in uris}
        job_args = [arg for job in jobs.values() for arg in ("--job", job["job_id"])]
        spread = ",".join(f"{n.url}={n.data_dir}" for n in nodes)
        with op.step("place x2"):  # each node fetches its share from a peer and verifies the hash
            table = op.text(a, "moe", "place", *job_args, "--nodes", spread, timeout=300)
            again = op(a, "moe", "place", *job_args, "--nodes", spread, "--json")
        print(table)
        assert "replication 2 over 3 providers" in table and table.count("(loaded)") == 2 * len(uris) + 2
        # idempotent: the second run finds everything where the first put it
        assert [r["outcome"] for answer in again for r in answer["gates"]] == ["held", "held"]  # on a alone
        for i, answer in enumerate(again):
            mine = sorted((r["layer"], r["expert"]) for r in answer["rows"] if r["provider"] == providers[i])
            assert mine == sorted(k for k, h in holders.items() if i in h)
            assert {r["outcome"] for r in answer["rows"] if r["provider"] == providers[i]} == {"held"}
            assert answer["replication"] == 2 and answer["providers"] == sorted(providers)
            idle = [p for p in sorted(providers) if not any(providers.index(p) in h for h in holders.values())]
            assert answer["idle"] == ([{"model_id": MODEL, "providers": idle}] if idle else [])

        with op.step("status x3"):
            answers = op.many([(n, ("moe", "status")) for n in nodes])
        for i, status in enumerate(answers):
            check_status(i, status, uris, holders, reference["runtime"].backend.name)

        want = {key: sorted(providers[i] for i in held) for key, held in holders.items()}
        with op.step("shard-map until replication 2"):
            shard = wait_for_replication(op, a, want)
        assert shard["covered_experts"] == 2 * N_EXPERTS and shard["distinct_providers"] == 3
        assert shard["under_replicated_experts"] == [] and shard["policy"]["min_replication"] == 2
        # catalog-shape read the model's shape: coverage counts against the whole model
        assert shard["expected_experts"] == 2 * N_EXPERTS and shard["uncovered_experts"] == []
        assert shard["unannounced"] is None
        assert all(h["replication"] == 2 for h in shard["holders"])
        assert all(x["blob_uri"] == uris[(h["layer"], h["expert"])] for h in shard["holders"] for x in h["holders"])

        # How a routing would fan out: every (token, expert) in exactly one batch, on one of its holders.
        routings = [{"token_index": t, "experts": [{"layer": 0, "expert": t % N_EXPERTS},
                                                   {"layer": 0, "expert": (t + 1) % N_EXPERTS}]} for t in range(6)]
        (tmp_path / "routings.json").write_text(json.dumps(routings))
        with op.step("plan-dispatch"):
            plan = op(a, "moe", "plan-dispatch", "--model", MODEL, "--routings", str(tmp_path / "routings.json"))
        assert plan["unroutable"] == []
        placed = sorted((t, b["expert"]) for b in plan["batches"] for t in b["token_indices"])
        assert placed == sorted((r["token_index"], e["expert"]) for r in routings for e in r["experts"])
        for batch in plan["batches"]:
            assert batch["provider"] in want[(0, batch["expert"])]
            assert batch["backups"] == [p for p in want[(0, batch["expert"])] if p != batch["provider"]]

        # The distributed forward, file in, file out, against the local forward over the same blobs:
        # layer 0 (q4_k_m) as the seed runs it (the default Q8_0 wire), layer 1 (q8_0) with f32 rows.
        hidden = np.random.default_rng(0).standard_normal((8, D_MODEL), np.float32)  # as README.md makes it
        (tmp_path / "hidden.f32").write_bytes(hidden.astype("<f4").tobytes())
        for layer, wire, bound in ((0, None, 0.05), (1, "f32", 1e-5)):
            out = tmp_path / f"combined-{layer}.f32"
            with op.step(f"forward layer {layer} ({wire or 'default'} wire)"):
                answer = op(a, "moe", "forward", "--model", MODEL, "--layer", str(layer), "--hidden",
                            str(tmp_path / "hidden.f32"), "--d-model", str(D_MODEL), "--out", str(out),
                            *(["--wire", wire] if wire else []))
            got = np.frombuffer(out.read_bytes(), dtype="<f4").reshape(8, D_MODEL)
            assert answer["bytes"] == hidden.nbytes and answer["missing"] == [] and answer["tokens"] == 8
            # Q8_0 on the wire rounds rows both ways (<= 2.2 % of a block's norm each way); f32 is exact
            error = rel_error(got, reference["runtime"].forward_local(model_id=MODEL, layer=layer, hidden=hidden))
            assert error < bound, (layer, wire, error)
            stats = answer["stats"]
            assert stats["codecs"][0] == (wire or "q8_0")  # offered, preferred first
            assert sum(h["rows"] for h in stats["holders"]) == 8 * TOP_K and stats["failures"] == []
            served = {h["provider"] for h in stats["holders"] if h["rows"]}
            assert len(served) >= 2 and served - {providers[0]}, stats  # rows crossed the network

        # The whole model: a loads the dense part and the gates, and generates over the network.
        with op.step("load-dense"):
            dense = op(a, "moe", "load-dense", "--model", MODEL, "--checkpoint", url)
        assert (dense["moe_layers"], dense["gates_loaded"], dense["vocab_size"]) == ([0, 1], 2, 64)
        with op.step(f"generate {NEW_TOKENS} tokens"):
            generation = op(a, "moe", "generate", "--model", MODEL, "--prompt-ids", ",".join(map(str, PROMPT)),
                            "--max-new-tokens", str(NEW_TOKENS), "--wire", "f32", "--steps")
        assert generation["state"] == "done" and generation["tokens"] == reference["tokens"], generation
        steps = generation["steps"]
        assert [s["phase"] for s in steps] == ["prefill"] + ["decode"] * (NEW_TOKENS - 1)
        assert [s["token"] for s in steps] == reference["tokens"]
        assert all([layer["layer"] for layer in s["layers"]] == [0, 1] for s in steps)
        assert all(layer["lost_gate_mass"] == 0 and layer["missing"] == 0 for s in steps for layer in s["layers"])
        with op.step("status"):
            status = op(a, "moe", "status")
        assert status["memory_used_bytes"] >= dense["dense_bytes"] > 0  # the dense part counts against the budget

    print("\n".join(f"{seconds:7.2f} s  {name}" for name, seconds in op.timings))
    # Nothing secret was logged: any node's operator token and node key, in any node's log.
    for log in (n.log() for n in nodes):
        for node in nodes:
            (assert_no_secrets or _assert_no_secrets_here)(log, data_dir=node.data_dir)


def _assert_no_secrets_here(text: str, *, data_dir: Path) -> None:
    """A simple check while testkit/secrets.py (issue 15's security review) is not merged."""
    token, seed = (data_dir / "operator.token").read_text().strip(), (data_dir / "node.key").read_bytes()
    for name, value in (("operator token", token), ("node key (hex)", seed.hex()),
                        ("node key (base64)", base64.b64encode(seed).decode())):
        assert len(value) >= 16 and value not in text, f"the {name} of {data_dir} appears in a node log"
