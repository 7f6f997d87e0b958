"""Sustained load: concurrent distributed forwards while a holder is SIGKILLed and restarted.

    .venv/bin/python -m bench.load [--clients 32] [--duration 60] [--tokens 8] [--rss-threshold-mb 64]

What is measured, and how. Five real nodes on loopback (`tenzro node run`, a Redis server of
their own): a router holding only the gate, and four holders of a 16-expert top-4 softmax layer
(d_model 512, d_ff 256, f32), expert e on holders e % 4 and (e + 1) % 4 (replication 2). `clients`
asyncio tasks each call `tenzro_moeForward` on the router over JSON-RPC (as an operator's client
does; Q8_0 on the wire, the default) back to back for `duration` seconds, each forward's rows
drawn from 16 prepared inputs whose local reference (`forward_local` in this process) is known,
so every answer is also checked. At a third of the run holder 1 is SIGKILLed (its whole process
group: supervisor, web, worker, Celery) and, 5 s later, restarted with the same data dir (its
experts come back from the disk tier); the load never pauses, and lasts at least 15 s after the
holder answers again (a restart takes ~20 s on a loaded 2-core machine). `--clients` and
`--duration` default to TENZRO_BENCH_LOAD_CLIENTS / TENZRO_BENCH_LOAD_DURATION_S, else 32 and 60.

Reported: forwards answered / failed by reason (an error answer's `data.reason`, a timeout, a
wrong answer), p50/p99 latency and throughput over the whole run and per phase (before the kill,
while the holder is down or restarting, after it is back), and the RSS of every process of every
node (psutil, children included) after a warm-up and at the end, with the growth flagged past
`--rss-threshold-mb`. The killed holder's processes are new after the restart: its "before" is
taken when it is back. Expected: 0 failures (replication 2: the router routes around the dead
holder); a failure must be fail-closed (an error with a reason, never a wrong answer).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import asyncio
import base64
import json
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from bench.forward import Layer, local_runtime, rel_error, write_layer
from testkit.nodes import TOKEN, NodeProcess
from testkit.redis_server import RedisNode, private_redis

from .report import print_table, write_results

LAYER = Layer("bench/load-layer", 512, 256, 16, 4)
N_HOLDERS = 4
N_INPUTS = 16
RESTART_AFTER_S = 5.0
AFTER_RESTART_S = 15.0  # the run lasts at least this long after the holder is back, whatever --duration says
NODE_ENV = {
    "TENZRO_GOSSIP_INTERVAL_S": "1", "TENZRO_GOSSIP_HEARTBEAT_S": "2", "TENZRO_GOSSIP_TTL_S": "60",
    "TENZRO_REACHABILITY_CHECK_S": "120",
    "TENZRO_PEER_MAX_STREAMS": "256", "TENZRO_PEER_RATE_PER_S": "1000000", "TENZRO_PEER_BURST": "1000000",
    "TENZRO_MEMORY_BUDGET_BYTES": str(2 << 30), "TENZRO_WORKER_TIMEOUT_S": "120",
    "TENZRO_FORWARD_ATTEMPT_TIMEOUT_S": "10", "TENZRO_FORWARD_FAILURE_COOLDOWN_S": "10",
}


def percentile(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def rss_by_process(nodes: dict[str, NodeProcess]) -> dict[str, int]:
    """RSS bytes of every process of every node: '<node> <pid> <what>' -> bytes."""
    out = {}
    for name, node in nodes.items():
        if node.process is None or node.process.poll() is not None:
            continue
        try:
            root = psutil.Process(node.process.pid)
            for p in (root, *root.children(recursive=True)):
                with p.oneshot():
                    cmd = " ".join(p.cmdline()[1:5])
                    role = next((r for r in ("expert_worker", "celery", "beat", "uvicorn", "daphne", "node run")
                                 if r in cmd), cmd[:40])
                    out[f"{name} {p.pid} {role}"] = p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return out


class Driver:
    """`clients` tasks calling tenzro_moeForward back to back; every outcome recorded with its time."""

    def __init__(self, router: NodeProcess, bodies: list[bytes], wants: list[np.ndarray], tokens: int) -> None:
        self.router, self.bodies, self.wants, self.tokens = router, bodies, wants, tokens
        self.records: list[tuple[float, float, str]] = []  # (finished at, seconds, outcome: "ok" or a reason)
        self.started = 0.0
        self.stop_at = float("inf")  # the fault thread may push it later (the run covers the restart)

    async def client(self, http: httpx.AsyncClient, k: int) -> None:
        i = k
        while time.monotonic() < self.stop_at:
            i = (i + 1) % len(self.bodies)
            t0 = time.monotonic()
            try:
                response = await http.post(f"{self.router.url}/rpc", content=self.bodies[i],
                                           headers={"Content-Type": "application/json"})
                answer = response.json()
                if "result" in answer:
                    result = answer["result"]
                    out = np.frombuffer(base64.b64decode(result["output"]), dtype="<f4").reshape(
                        result["tokens"], LAYER.d_model)
                    # Q8_0 both ways: within the 5 % bound of tests/e2e/test_forward.py
                    outcome = "ok" if rel_error(out, self.wants[i]) < 0.05 and not result["missing"] else "WRONG"
                else:
                    outcome = f"error:{(answer.get('error', {}).get('data') or {}).get('reason', 'no reason')}"
            except httpx.TimeoutException:
                outcome = "client timeout"
            except (httpx.HTTPError, ValueError) as exc:
                outcome = f"http:{type(exc).__name__}"
            self.records.append((time.monotonic() - self.started, time.monotonic() - t0, outcome))

    async def run(self, clients: int, duration_s: float) -> None:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            self.started = time.monotonic()
            self.stop_at = max(self.stop_at if self.stop_at != float("inf") else 0.0, self.started + duration_s)
            await asyncio.gather(*(self.client(http, k) for k in range(clients)))


def phase_rows(records: list[tuple[float, float, str]], phases: dict[str, tuple[float, float]],
               tokens: int) -> list[list[Any]]:
    rows = []
    for name, (start, end) in phases.items():
        inside = [r for r in records if start <= r[0] < end]
        ok = [r[1] * 1e3 for r in inside if r[2] == "ok"]
        failed = Counter(r[2] for r in inside if r[2] != "ok")
        span = max(1e-9, end - start)
        rows.append([name, f"{start:.0f}-{end:.0f}", len(inside), len(ok), sum(failed.values()),
                     ", ".join(f"{k} {v}" for k, v in failed.items()) or "-", percentile(ok, 50), percentile(ok, 99),
                     len(ok) / span, len(ok) * tokens / span])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=int(os.environ.get("TENZRO_BENCH_LOAD_CLIENTS", 32)))
    parser.add_argument("--duration", type=float, default=float(os.environ.get("TENZRO_BENCH_LOAD_DURATION_S", 60)))
    parser.add_argument("--tokens", type=int, default=8, help="rows per forward")
    parser.add_argument("--rss-threshold-mb", type=float, default=64.0, help="flag a process growing more")
    parser.add_argument("--quick", action="store_true", help="8 clients for 20 s (+ the restart)")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.duration = 8, 20.0
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-load-"))
    rng = np.random.default_rng(0)
    gate, experts = write_layer(LAYER, work / "payloads", rng)
    runtime = local_runtime({LAYER: (gate, experts)}, work / "local")
    inputs = [rng.standard_normal((args.tokens, LAYER.d_model), dtype=np.float32) for _ in range(N_INPUTS)]
    wants = [runtime.forward_local(model_id=LAYER.model_id, layer=0, hidden=h) for h in inputs]
    bodies = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeForward", "params": {
        "model_id": LAYER.model_id, "d_model": LAYER.d_model, "hidden": base64.b64encode(h.tobytes()).decode()}}
    ).encode() for h in inputs]
    nodes: dict[str, NodeProcess] = {}
    try:
        with private_redis() as redis_host:
            router = RedisNode(data_dir=work / "router", redis_db=1, redis_host=redis_host)
            holders = [RedisNode(data_dir=work / f"holder{i}", redis_db=2 + i, redis_host=redis_host,
                                 peers=[router.url]) for i in range(N_HOLDERS)]
            nodes = {"router": router, **{f"holder{i}": h for i, h in enumerate(holders)}}
            with ThreadPoolExecutor(len(nodes)) as pool:
                list(pool.map(lambda n: n.start(**NODE_ENV), nodes.values()))
            router.result("tenzro_moeGateLoad", {"path": str(gate)}, token=TOKEN)
            for e, path in enumerate(experts):
                for i in (e % N_HOLDERS, (e + 1) % N_HOLDERS):
                    assert "result" in holders[i].rpc("tenzro_moeExpertLoad", {"path": str(path)}, token=TOKEN,
                                                      timeout=120)
            deadline = time.monotonic() + 120
            while True:
                shard = router.result("tenzro_moeShardMap", {"model_id": LAYER.model_id})["holders"]
                if len(shard) == LAYER.n_routed and all(len(e["holders"]) == 2 for e in shard):
                    break
                assert time.monotonic() < deadline, "the router did not see every expert at replication 2"
                time.sleep(1)
            warm = Driver(router, bodies, wants, args.tokens)
            asyncio.run(warm.run(args.clients, 5.0))  # connections, pools, the hedging book
            rss_before = rss_by_process(nodes)
            victim = holders[1]
            events: dict[str, float] = {}
            driver = Driver(router, bodies, wants, args.tokens)

            def fault() -> None:
                time.sleep(args.duration / 3)
                events["killed"] = time.monotonic() - driver.started
                os.killpg(victim.process.pid, signal.SIGKILL)
                victim.process.wait()
                time.sleep(RESTART_AFTER_S)
                events["restarting"] = time.monotonic() - driver.started
                victim.start(**NODE_ENV)
                events["back"] = time.monotonic() - driver.started
                driver.stop_at = max(driver.stop_at, time.monotonic() + AFTER_RESTART_S)
                time.sleep(3)  # its first forwards after the restart (connections, promotions from disk)
                rss_before.update(rss_by_process({"holder1": victim}))  # new pids: the killed ones have no "after"

            thread = threading.Thread(target=fault, daemon=True)
            thread.start()
            asyncio.run(driver.run(args.clients, args.duration))
            thread.join(timeout=120)
            rss_after = rss_by_process(nodes)
    finally:
        with ThreadPoolExecutor(max(1, len(nodes))) as pool:
            list(pool.map(lambda n: n.stop(), nodes.values()))
        shutil.rmtree(work, ignore_errors=True)
    report(args, driver, events, rss_before, rss_after, len(warm.records))


def report(args: argparse.Namespace, driver: Driver, events: dict[str, float], rss_before: dict[str, int],
           rss_after: dict[str, int], warmup_forwards: int) -> None:
    records = driver.records
    end = max((r[0] for r in records), default=args.duration)
    killed, back = events.get("killed", end), events.get("back", end)
    phases = {"whole run": (0.0, end + 1e-6), "before the kill": (0.0, killed),
              "holder down / restarting": (killed, back), "after restart": (back, end + 1e-6)}
    rows = phase_rows(records, phases, args.tokens)
    print(f"\nholder1 SIGKILLed at {killed:.1f} s, restart begun at {events.get('restarting', float('nan')):.1f} s, "
          f"answering again at {back:.1f} s; {warmup_forwards} warm-up forwards before the run")
    print_table(f"Load: {args.clients} clients × tenzro_moeForward ({args.tokens} tokens, Q8_0 wire) for "
                f"{args.duration:.0f} s on a router + {N_HOLDERS} holders (replication 2); ms; forwards/s, tokens/s",
                ["phase", "s", "forwards", "ok", "failed", "failures by reason", "p50", "p99", "forwards/s",
                 "tokens/s"], rows)
    rss_rows, flagged = [], []
    for key in sorted(set(rss_before) | set(rss_after)):
        b, a = rss_before.get(key), rss_after.get(key)
        growth = None if a is None or b is None else (a - b) / 2**20
        flag = growth is not None and growth > args.rss_threshold_mb
        if flag:
            flagged.append(key)
        rss_rows.append([key, "-" if b is None else b / 2**20, "killed" if a is None else a / 2**20,
                         "-" if growth is None else growth, "FLAG" if flag else ""])
    print_table(f"RSS of every node process, MiB (before = after a 5 s warm-up, or 3 s after the restart for the "
                f"restarted holder's new processes; "
                f"flag: growth > {args.rss_threshold_mb:g} MiB)",
                ["process", "before", "after", "growth", ""], rss_rows)
    whole = rows[0]
    failures = Counter(r[2] for r in records if r[2] != "ok")
    wrong = failures.get("WRONG", 0)
    print(f"\nfailures: {sum(failures.values())} ({dict(failures) or 'none'}); wrong answers: {wrong}; "
          f"processes over the RSS threshold: {flagged or 'none'}")
    write_results("load", {
        "clients": args.clients, "duration_s": args.duration, "tokens": args.tokens, "events_s": events,
        "phases": [dict(zip(["phase", "span_s", "forwards", "ok", "failed", "failures", "p50_ms", "p99_ms",
                             "forwards_per_s", "tokens_per_s"], row, strict=True)) for row in rows],
        "failures": dict(failures), "rss_before": rss_before, "rss_after": rss_after, "rss_flagged": flagged,
        "rss_threshold_mb": args.rss_threshold_mb,
        "headline": [
            {"name": "forwards failed (of all answered)", "value": sum(failures.values()), "unit": "forwards",
             "reference": "forwards sent", "reference_value": whole[2],
             "ratio": sum(failures.values()) / max(1, whole[2]),
             "target": "0 (or fail-closed with a reason), 0 wrong"},
            {"name": f"forward p50, {args.clients} clients, holder killed and restarted", "value": whole[6],
             "unit": "ms", "reference": "p50 before the kill", "reference_value": rows[1][6],
             "ratio": whole[6] / rows[1][6] if whole[6] and rows[1][6] else None, "target": "—"},
            {"name": "forward p99", "value": whole[7], "unit": "ms", "reference": "p99 before the kill",
             "reference_value": rows[1][7], "ratio": whole[7] / rows[1][7] if whole[7] and rows[1][7] else None,
             "target": "—"},
            {"name": "throughput", "value": whole[8], "unit": "forwards/s", "reference": "before the kill",
             "reference_value": rows[1][8], "ratio": whole[8] / rows[1][8] if rows[1][8] else None, "target": "—"},
            {"name": "processes whose RSS grew past the threshold", "value": len(flagged), "unit": "processes",
             "reference": f"threshold {args.rss_threshold_mb:g} MiB", "reference_value": args.rss_threshold_mb,
             "ratio": None, "target": "0"},
        ]})


if __name__ == "__main__":
    main()
