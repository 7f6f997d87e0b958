"""Fault injection on three real nodes sharing one Redis server of their own (loopback only).

a routes (it prepared the tiny checkpoint's blobs and holds the gate); b and c each hold all
four experts, loaded by blob URI, so every expert has two holders. The faults run in order on
the same network: b SIGKILLed while forwards stream; b restarted with its data dir after a
byte of one of its blobs was flipped; the Redis server dropped for seconds; a's Celery worker
killed while it holds a settlement. Every forward is compared with the single-node reference;
each fault is logged with what was injected and observed (tests/conftest.py prints the
summary table). Faults injected elsewhere report into the same log: a hanging holder and
killed holders (test_forward.py), a Celery kill during a prepare job and a tampered blob
(test_prepare_blobs.py), a worker restart (test_worker_state.py), a settlement delivered
three times (test_settlement.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import redis

from apps.blobs.store import parse_blob_uri
from core.experts.runtime import ExpertRuntime
from core.transport.quic import QuicSettings, quic_call
from testkit.checkpoints import qwen3_moe
from testkit.nodes import TOKEN, stop_all
from testkit.redis_server import RedisNode, RedisServer
from tests.e2e.test_gossip import FAST, wait_for

pytestmark = pytest.mark.e2e
MODEL, D_MODEL, N_EXPERTS, TOKENS = "tiny-qwen3", 64, 4, 64
# b's record must outlive the kill stream (the forward itself routes around it) but not its restart.
# Celery's heartbeat every 2 s: the Redis test waits for it to prove Celery is consuming again.
ENV = {**FAST, "TENZRO_FORWARD_ATTEMPT_TIMEOUT_S": "10", "TENZRO_FORWARD_HEDGE_DEFAULT_S": "0.5",
       "TENZRO_FORWARD_FAILURE_COOLDOWN_S": "15", "TENZRO_HEARTBEAT_S": "2"}
FORWARD_IDS: list[str] = []  # every forward answered with remote work: each must be settled once


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Network:
    def __init__(self, redis_server: RedisServer, root: Path) -> None:
        self.redis = redis_server
        self.root = root
        self.a = RedisNode(data_dir=root / "a", redis_db=1, redis_host=redis_server.url)
        self.b = RedisNode(data_dir=root / "b", redis_db=2, redis_host=redis_server.url)
        self.c = RedisNode(data_dir=root / "c", redis_db=3, redis_host=redis_server.url)
        self.local = ExpertRuntime(data_dir=root / "reference")
        self.blobs: dict[int, str] = {}  # expert -> blob hash
        self.last_error: dict | None = None  # the last forward that failed closed, for the observations

    @property
    def nodes(self) -> list[RedisNode]:
        return [self.a, self.b, self.c]

    def reference(self, hidden: np.ndarray) -> np.ndarray:
        return self.local.forward_local(model_id=MODEL, layer=0, hidden=hidden)

    def forward(self, hidden: np.ndarray) -> dict:
        return self.a.rpc("tenzro_moeForward", {"model_id": MODEL, "d_model": D_MODEL, "wire": "f32",
                                                "hidden": b64(hidden.tobytes())}, timeout=60)

    def outcome(self, answer: dict, hidden: np.ndarray) -> str:
        """`correct`, `closed:<reason>` (failed closed, with a reason) or `wrong` (a lost or bad answer)."""
        if "error" in answer:
            self.last_error = answer["error"]
            reason = (answer["error"].get("data") or {}).get("reason")
            return f"closed:{reason}" if reason and reason != "internal_error" else "wrong"
        result = answer["result"]
        got = np.frombuffer(base64.b64decode(result["output"]), dtype="<f4").reshape(result["tokens"], D_MODEL)
        want = self.reference(hidden)
        if result["missing"] or np.linalg.norm(got - want) / np.linalg.norm(want) > 1e-5:
            return "wrong"
        if any(h["rows"] and h["transport"] != "local" for h in result["stats"]["holders"]):
            FORWARD_IDS.append(result["stats"]["forward_id"])
        return "correct"

    def holders_detail(self) -> list[dict]:
        return self.a.result("tenzro_moeShardMap", {"model_id": MODEL})["holders"]

    def holders(self) -> dict[int, set[str]]:
        return {e["expert"]: {h["provider"] for h in e["holders"]} for e in self.holders_detail()}


def provider_of(node: RedisNode) -> str:
    return node.result("tenzro_nodeInfo")["provider_id"]


def hidden_rows(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((TOKENS, D_MODEL)).astype(np.float32)


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer().start()
    yield server
    server.close()


@contextlib.contextmanager
def prepared_network(redis_server: RedisServer, root: Path, env: dict[str, str], *,
                     node_env: dict[str, dict[str, str]] | None = None, net: Network | None = None
                     ) -> Iterator[Network]:
    """a, b and c started with `env` (and `node_env` by name, "c": {...}); a prepared the checkpoint
    and holds the gate; b and c hold every expert (loaded by blob URI from a); a sees both holders
    of every expert."""
    net = net or Network(redis_server, root)  # one built already when a test needs its ports first
    node_env = node_env or {}
    model = qwen3_moe(root / "ckpt", d_model=D_MODEL, d_ff=32, n_experts=N_EXPERTS, n_layers=1, shards=1)
    net.b.peers = net.c.peers = [net.a.url]  # a's ports are chosen already: all three start side by side
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda name: getattr(net, name).start(**env, **node_env.get(name, {})), "abc"))
        print(f"three nodes up in {time.monotonic() - started:.1f} s")
        job = net.a.result("tenzro_moePrepareExperts", {"model_id": MODEL, "layer": 0, "quant": "q8_0",
                                                        "experts": list(range(N_EXPERTS)),
                                                        "checkpoint": str(model.root)}, token=TOKEN)
        job = wait_for(lambda: (j := net.a.result("tenzro_moePrepareStatus", {"job_id": job["job_id"]}))["state"]
                       in ("done", "failed") and j, 120, "the prepare job")
        assert job["state"] == "done", job
        net.a.result("tenzro_moeGateLoad", {"blob_uri": job["gate"]["blob_uri"]}, token=TOKEN)
        for entry in job["experts"]:
            for node in (net.b, net.c):  # fetched from a, verified, stored: the holders' blobs
                node.result("tenzro_moeExpertLoad", {"blob_uri": entry["blob_uri"]}, token=TOKEN)
            net.blobs[entry["expert"]] = parse_blob_uri(entry["blob_uri"])
        # the reference: the same payloads, in one runtime of this process
        store = net.a.data_dir / "blobs"
        net.local.gate_load(payload=(store / parse_blob_uri(job["gate"]["blob_uri"])[:2]
                                     / parse_blob_uri(job["gate"]["blob_uri"])).read_bytes())
        for digest in net.blobs.values():
            net.local.expert_load(payload=(store / digest[:2] / digest).read_bytes())
        wait_for(lambda: (h := net.holders()) and len(h) == N_EXPERTS and all(len(p) == 2 for p in h.values()),
                 60, "a to see both holders of every expert")
        print(f"network prepared, loaded and gossiped in {time.monotonic() - started:.1f} s")
        yield net
    finally:
        stop_all(net.nodes)


@pytest.fixture(scope="module")
def net(redis_server, tmp_path_factory) -> Iterator[Network]:
    with prepared_network(redis_server, tmp_path_factory.mktemp("faults"), ENV) as network:
        yield network


def test_a_holder_sigkilled_mid_forward(net, faults) -> None:
    pid_b = provider_of_cached(net, "b")
    fault = faults.inject("holder SIGKILLed mid-forward",
                          "SIGKILL to holder b's process group while 2 clients stream forwards")
    outcomes: Counter[str] = Counter()
    in_flight = [0]
    done, killed = threading.Event(), threading.Event()
    lock = threading.Lock()

    def client(seed: int) -> None:
        after_kill = 0
        while after_kill < 4:
            hidden = hidden_rows(seed)
            seed += 2
            with lock:
                in_flight[0] += 1
            answer = net.forward(hidden)
            with lock:
                in_flight[0] -= 1
                outcomes[net.outcome(answer, hidden)] += 1
                if sum(outcomes.values()) >= 4:
                    done.set()
            after_kill += killed.is_set()

    with ThreadPoolExecutor(2) as pool:
        clients = [pool.submit(client, seed) for seed in (100, 101)]
        assert done.wait(60), outcomes
        with lock:
            flying = in_flight[0]
        os.killpg(net.b.process.pid, signal.SIGKILL)
        killed.set()
        for f in clients:
            f.result(timeout=120)
    net.b.process.wait()
    penalties = net.a.result("tenzro_moeHolderPenalties")["by_provider"]
    fault.observe(f"{flying} forwards in flight at the kill; outcomes {dict(outcomes)}; "
                  f"penalties on b {penalties.get(pid_b, {})}")
    lost = sum(n for outcome, n in outcomes.items() if outcome != "correct")
    assert lost == 0 and outcomes["correct"] >= 8, outcomes
    fault.close(lost=lost)


_PROVIDERS: dict[str, str] = {}


def provider_of_cached(net: Network, name: str) -> str:
    """A node's provider id, remembered (it may be dead when asked again)."""
    if name not in _PROVIDERS:
        _PROVIDERS[name] = provider_of(getattr(net, name))
    return _PROVIDERS[name]


def test_a_holder_restarted_with_its_data_dir_after_a_blob_rotted(net, faults) -> None:
    pid_b = provider_of_cached(net, "b")
    net.b.kill()  # the kill test killed it (its children may still be going), or did not run
    restart = faults.inject("holder restarted with its data dir",
                            "b (killed) started again on the same data dir and ports")
    rot = faults.inject("blob corrupted on disk",
                        "one byte flipped in the weights of b's stored blob of expert 0 while b was down")
    path = net.b.data_dir / "blobs" / net.blobs[0][:2] / net.blobs[0]
    with open(path, "r+b") as blob:  # in place: the disk tier's file is a hard link to it
        blob.seek(-7, os.SEEK_END)
        byte = blob.read(1)
        blob.seek(-7, os.SEEK_END)
        blob.write(bytes([byte[0] ^ 0x10]))
    wait_for(lambda: all(pid_b not in p for p in net.holders().values()), 30, "b's record to expire at a")

    net.b.start(**ENV)
    # b's warm-up reads each payload back from its disk tier into memory and checks its hash first:
    # expert 0's is refused (never decoded), forgotten, and its blob fetched again from a peer.
    calls = wait_for(lambda: (c := net.b.result("tenzro_workerStatus")["calls"]).get("disk_tier.refetched") and c,
                     60, "b to fetch expert 0's blob again from a peer")
    status = wait_for(lambda: len((s := net.b.result("tenzro_moeExpertStatus"))["experts"]) == N_EXPERTS and s, 30,
                      "b to hold every expert again")
    tiers = sorted((e["expert"], e["tier"]) for e in status["experts"])
    restart.observe(f"b's experts after the restart: {tiers}")
    rot.observe(f"b's counters: corrupt {calls.get('disk_tier.corrupt')}, "
                f"refetched {calls.get('disk_tier.refetched')}, "
                f"blob fetches {({k: v for k, v in calls.items() if k.startswith('blob_fetch')})}")
    assert calls.get("disk_tier.corrupt") == 1, calls
    assert tiers == [(e, "memory") for e in range(N_EXPERTS)], tiers
    hidden = hidden_rows(7)
    again = net.b.result("tenzro_moeExecute", {"model_id": MODEL, "layer": 0, "expert": 0, "d_model": D_MODEL,
                                               "hidden": b64(hidden[:4].tobytes())})
    got = np.frombuffer(base64.b64decode(again["output"]), dtype="<f4").reshape(4, D_MODEL)
    want = net.local.execute(model_id=MODEL, layer=0, expert=0, hidden=hidden[:4])
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)

    # b announces itself again: a's shard map lists it as a holder of every expert, beside c (the
    # other holder of every expert); every forward after that is answered exactly.
    pid_c = provider_of_cached(net, "c")
    wait_for(lambda: all({pid_b, pid_c} <= p for p in net.holders().values()), 30, "b's new record at a, beside c's")
    outcomes = [net.outcome(net.forward(hidden), hidden) for _ in range(3)]
    restart.observe(f"a sees b holding all {N_EXPERTS} experts again; 3 forwards after it: {outcomes}"
                    + (f" (last closed: {net.last_error})" if net.last_error else ""))
    assert outcomes == ["correct"] * 3, net.last_error
    restart.close(lost=3 - outcomes.count("correct"))
    rot.close(lost=0)


def quic_status(node: RedisNode, pin: str) -> dict:
    settings = QuicSettings(max_body=1 << 20)
    result, _ = asyncio.run(quic_call(host="127.0.0.1", port=node.quic_port, pin_sha256=pin, method="moe/status",
                                      params={}, settings=settings, timeout_s=5))
    return result


def test_redis_dropped_for_seconds(net, redis_server, faults) -> None:
    pins = {n.url: n.result("tenzro_nodeInfo")["endpoints"]["quic_cert_sha256"] for n in net.nodes}
    fault = faults.inject("Redis dropped", "the nodes' redis-server SIGKILLed, started again 3 s later (empty)")
    redis_server.stop()
    dropped = time.monotonic()
    health = net.a.result("tenzro_nodeHealth")
    status = net.b.result("tenzro_moeExpertStatus")  # read from b's database: still answers
    worker = net.a.rpc("tenzro_workerStatus")
    hidden = hidden_rows(8)
    during = net.outcome(net.forward(hidden), hidden)
    peer = wait_for(lambda: "redis" in (s := quic_status(net.b, pins[net.b.url]))["degraded"] and s, 10,
                    "b's worker to report redis degraded over QUIC")
    fault.observe(f"health {health['status']} {health['degraded']}; expert status degraded {status['degraded']} "
                  f"({len(status['experts'])} experts still listed); workerStatus "
                  f"{worker.get('error', {}).get('data', {}).get('reason')}; a forward: {during}; "
                  f"b's moe/status over QUIC: degraded {peer['degraded']}")
    assert health["status"] == "degraded" and "redis" in health["degraded"], health
    assert "redis" in status["degraded"] and len(status["experts"]) == N_EXPERTS, status
    assert worker["error"]["data"]["reason"] == "redis_unavailable", worker
    assert during == "closed:redis_unavailable"

    time.sleep(max(0.0, 3.0 - (time.monotonic() - dropped)))
    redis_server.start()
    back = time.monotonic()
    for node in net.nodes:
        wait_for(lambda n=node: "result" in (s := n.rpc("tenzro_workerStatus")) and not s["result"]["degraded"],
                 30, f"{node.url}'s worker to answer through Redis again")
    recovered_s = time.monotonic() - back
    # Celery reconnects by itself (its pool restarted): the first heartbeat after the restart. Where it
    # exits instead (below), its own shutdown took 32 s on a loaded CI host before the supervisor could
    # start it again: the wait allows for that.
    for node in net.nodes:
        wait_for(lambda n=node: n.result("tenzro_nodeProcesses")["celery_heartbeat_age_s"] is not None, 90,
                 f"{node.url}'s Celery worker to run a heartbeat again")
    celery_s = time.monotonic() - back
    health = [n.result("tenzro_nodeHealth")["status"] for n in net.nodes]
    outcome = net.outcome(net.forward(hidden), hidden)
    restarts = Counter()
    for node in net.nodes:
        restarts.update({p["name"]: p["restarts"] for p in node.result("tenzro_nodeProcesses")["processes"]})
    outages = [n.result("tenzro_workerStatus")["calls"].get("operator_door.redis_outages", 0) for n in net.nodes]
    fault.observe(f"every worker answered again {recovered_s:.1f} s after Redis came back, every Celery worker "
                  f"ran a heartbeat at {celery_s:.1f} s; health {health}; "
                  f"a forward: {outcome}; operator-door outages {outages}; process restarts {dict(restarts)}")
    assert health == ["ok"] * 3 and outcome == "correct"
    # Ours recover in place. Celery 5 sometimes exits when its broker vanishes (kombu's
    # restore_unacked_once on the closed connection: AttributeError), and the supervisor starts it
    # again; the prepare jobs and settlements it held are resumed from the database at its start.
    assert restarts["web"] == restarts["expert-worker"] == restarts["celery-beat"] == 0, restarts
    fault.close(lost=int(outcome != "correct"))


def test_the_celery_worker_killed_during_a_settlement(net, faults) -> None:
    a = net.a
    fault = faults.inject("Celery worker killed during a settlement",
                          "SIGKILL to a's Celery worker while it holds a settle_forward message, its pool stopped")
    processes = {p["name"]: p["pid"] for p in a.result("tenzro_nodeProcesses")["processes"]}
    main = psutil.Process(processes["celery-worker"])
    pool = main.children(recursive=True)
    assert pool, "a prefork Celery worker has a pool process"
    # Beat stopped too: with its pool stopped the worker reserves at most 4 messages (one process,
    # prefetch multiplier 4), and this module's 1-2 s periodic tasks would fill them before the
    # forward's settlement arrives, leaving it in the queue (the test then waited in vain).
    beat = psutil.Process(processes["celery-beat"])
    beat.suspend()
    broker = redis.Redis.from_url(a.redis_url)
    try:
        # What beat sent before it stopped must run first: reserved while the pool is stopped, those
        # messages would take the worker's 4 slots too.
        wait_for(lambda: broker.llen("celery") == 0, 30, "the worker to take what beat sent before it stopped")
        time.sleep(1.0)  # and run them (a periodic task here takes milliseconds)
        for child in pool:
            child.suspend()  # the message is delivered to the worker, never run
        hidden = hidden_rows(9)
        assert net.outcome(net.forward(hidden), hidden) == "correct"
        forward_id = FORWARD_IDS[-1]
        # This forward's own message among the worker's unacknowledged ones (its headers' argsrepr
        # names the forward_id): a count of them would also move with messages restored by a worker
        # that restarted earlier in the module (Celery sometimes exits on the Redis drop).
        wait_for(lambda: any(forward_id.encode() in v for v in broker.hvals("unacked")), 30,
                 "the worker to take the settlement")
        assert a.result("tenzro_moeSettlements", {"forward_id": forward_id})["settlements"] == []
        # The pool first: a stopped child would otherwise meet its parent-death signal only once
        # resumed, and could run the settlement before dying, with nothing restarted.
        for child in pool:
            child.kill()
        main.kill()
    finally:
        for child in pool:
            if child.is_running():
                child.resume()
        beat.resume()
    paid = wait_for(lambda: a.result("tenzro_moeSettlements", {"forward_id": forward_id})["settlements"], 90,
                    "the restarted worker to settle the forward")
    after = wait_for(lambda: next((p for p in a.result("tenzro_nodeProcesses")["processes"]
                                   if p["name"] == "celery-worker" and p["restarts"] >= 1), None), 30,
                     "the supervisor to count the Celery worker's restart")

    # Nothing lost, nothing paid twice: every forward of this module with remote work, once.
    def settled(fid: str) -> int:
        return len(a.result("tenzro_moeSettlements", {"forward_id": fid})["settlements"])

    fids = list(dict.fromkeys(FORWARD_IDS))
    wait_for(lambda: all(settled(f) for f in fids), 60, "every forward of this module to be settled")
    counts = Counter(settled(f) for f in fids)
    fault.observe(f"settled once after the supervisor restarted the worker (restarts {after['restarts']}, "
                  f"total {paid[0]['total']}); the module's {len(fids)} forwards settled {dict(counts)} times")
    assert len(paid) == 1 and after["restarts"] >= 1 and set(counts) == {1}, counts
    fault.close(lost=len(fids) - counts[1])
