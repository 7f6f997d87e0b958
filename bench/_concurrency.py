"""bench/generate.py --concurrency: N generations at once through the router's continuous batching.

For each level N, N generations of distinct 32-token prompts are started together (`tenzro_moeGenerate`
with wait false) and followed to their ends. Measured: aggregate tokens/s (every generated token over
the wall time from the first start to the last end, prefills included), the decode steps' p50 and p99
(each sequence's inter-token latency, as its record timed it), the iterations the router ran (Σ 1/batch
over the steps: each iteration of b sequences gives each of them one step of batch b), and each holder's
`moe/execute` requests (its /metrics, before and after) per MoE layer per iteration: 1 is one request per
holder per layer per iteration, whatever N. The reference is N = 1 in the same run.

The same N prompts then run batched in one process (bench/_generate_model.py `Local.generate_batch`:
WholeModel.run_batch with every expert local, no network), just before the distributed level (once
the nodes are quiet) so drift hits both alike: its own gain from N = 1 to N is the most batching can
give on this machine's cores and memory, whatever the network does (N sequences x top-8 touch many
more experts, each read whole), and the distributed level's tokens/s over its is the share of that
ceiling the nodes reach.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import numpy as np

from testkit.nodes import TOKEN, NodeProcess

from . import _pyspy
from ._generate_model import Local
from .report import RESULTS_DIR, print_table


def execute_requests(node: NodeProcess) -> float:
    """The node's expert worker's `moe/execute` calls through the peer door, so far."""
    total = 0.0
    for line in httpx.get(f"{node.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("tenzro_worker_requests_total{") and 'door="peer"' in line \
                and 'method="moe/execute"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def one_level(router: NodeProcess, holders: list[NodeProcess], model_id: str, prompts: list[list[int]],
              max_new: int, n_moe_layers: int) -> dict[str, Any]:
    n = len(prompts)
    before = [execute_requests(h) for h in holders]
    started = time.perf_counter()
    ids = [router.result("tenzro_moeGenerate", {"model_id": model_id, "prompt_ids": p, "max_new_tokens": max_new,
                                                "stop_at_eos": False, "wire": "q8_0", "wait": False},
                         token=TOKEN)["generation_id"] for p in prompts]
    pending = set(ids)
    # One list call (records without steps) every 50 ms: a call per generation would put hundreds of
    # requests a second on the router's cores that the iterations it measures need. Each record is
    # read whole once, after the wall clock stops.
    while pending:
        for record in router.result("tenzro_moeGenerations", {"limit": n + 8})["generations"]:
            if record["generation_id"] in pending and record["state"] != "running":
                assert record["state"] == "done", record.get("error")
                pending.discard(record["generation_id"])
        time.sleep(0.05)
    wall = time.perf_counter() - started
    records = {gid: router.result("tenzro_moeGeneration", {"generation_id": gid}) for gid in ids}
    requests = [after - b for after, b in zip((execute_requests(h) for h in holders), before, strict=True)]
    steps = [s for r in records.values() for s in r["steps"]]
    decode_ms = sorted(s["ms"] for s in steps if s["phase"] == "decode")
    iterations = sum(1.0 / max(1, s["layers"][0]["batch"]) for s in steps if s["layers"])
    decodes = [s for s in steps if s["phase"] == "decode" and s["layers"]]
    # where a decode iteration goes: the router's dense part, the MoE layers' round trips, and of those
    # the slowest holder's compute per layer (summed over the layers)
    where = {"dense_ms": statistics.median(s["dense_ms"] or 0.0 for s in decodes),
             "moe_ms": statistics.median(sum(layer["ms"] for layer in s["layers"]) for s in decodes),
             "holder_ms": statistics.median(sum(max((h["compute_ms"] or 0.0 for h in layer["holders"]), default=0.0)
                                                for layer in s["layers"]) for s in decodes)}
    return {"concurrency": n, "tokens": sum(len(r["tokens"]) for r in records.values()), "wall_s": wall,
            "tokens_per_s": sum(len(r["tokens"]) for r in records.values()) / wall,
            "inter_token_p50_ms": statistics.median(decode_ms),
            "inter_token_p99_ms": decode_ms[min(len(decode_ms) - 1, int(0.99 * len(decode_ms)))],
            "iterations": iterations, "largest_batch": max(s["layers"][0]["batch"] for s in steps if s["layers"]),
            "holder_requests_per_layer_iteration": max(requests) / (iterations * n_moe_layers), **where}


def cpu_busy_share(seconds: float) -> float:
    """The share of this machine's CPU time that was not idle over the next `seconds` (/proc/stat)."""
    def idle_total() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    idle0, total0 = idle_total()
    time.sleep(seconds)
    idle1, total1 = idle_total()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_quiet(limit_s: float = 15.0) -> None:
    """Until the nodes are done with the last level's aftermath (records, settlements: under 15 % of the
    CPU for half a second), or limit_s: the one-process level must not share the cores with it."""
    deadline = time.monotonic() + limit_s
    while cpu_busy_share(0.5) > 0.15 and time.monotonic() < deadline:
        pass


def local_level(local: Local, prompts: list[list[int]], max_new: int) -> dict[str, Any]:
    """The same prompts batched in one process: tokens/s (prefill included), the decode iterations' p50,
    and the medians of their dense and MoE parts."""
    run = local.generate_batch(prompts, max_new)
    moe = statistics.median(run["decode_moe_ms"])
    return {"tokens_per_s": sum(len(t) for t in run["tokens"]) / run["wall_s"],
            "inter_token_p50_ms": statistics.median(run["decode_iteration_ms"]), "moe_ms": moe,
            "dense_ms": statistics.median(i - m for i, m in zip(run["decode_iteration_ms"], run["decode_moe_ms"],
                                                                strict=True))}


def profiled_level(router: NodeProcess, holders: list[NodeProcess], model_id: str, prompts: list[list[int]],
                   max_new: int, n_moe_layers: int) -> dict[str, Any]:
    """one_level while py-spy samples the router's expert worker (--profile): where an iteration goes."""
    n = len(prompts)
    spy = _pyspy.Profile(router.result("tenzro_workerStatus")["pid"], RESULTS_DIR / f"profile-router-{n}-at-once.txt",
                         seconds=6.0)
    row = one_level(router, holders, model_id, prompts, max_new, n_moe_layers)
    summary = spy.finish(steps=max(1, round(row["iterations"])))
    print_table(f"Profile of the router's expert worker, {n} generations at once: CPU ms per iteration by thread "
                f"(/proc, the first 6 s), then the event loop's busy functions (py-spy or its own cProfile, "
                f"raw: {summary['raw']})",
                ["thread / frame", "ms per iteration / share"],
                [*([k, v] for k, v in summary["cpu_ms_per_step"].items()),
                 *([f, f"{share:.1%}"] for f, share in summary["event_loop_busy"])])
    return {**row, "profile": summary}


def concurrency(router: NodeProcess, holders: list[NodeProcess], local: Local, model_id: str, levels: list[int],
                vocab: int, max_new: int, n_moe_layers: int, rng: np.random.Generator, *, profile: bool = False
                ) -> list[dict[str, Any]]:
    def prompts(n: int) -> list[list[int]]:
        return [[int(t) for t in rng.integers(0, vocab, 32)] for _ in range(n)]

    one_level(router, holders, model_id, prompts(2), 4, n_moe_layers)  # warm
    local_level(local, prompts(2), 4)
    rows = []
    for n in levels:
        asked = prompts(n)
        wait_quiet()
        alone = local_level(local, asked, max_new)
        rows.append({**one_level(router, holders, model_id, asked, max_new, n_moe_layers), "one_process": alone})
    if profile:  # the largest level again, profiled: the table's row is unprofiled
        profiled_level(router, holders, model_id, prompts(levels[-1]), max_new, n_moe_layers)
    base = rows[0]
    for row in rows:
        row["tokens_per_s_ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["inter_token_ratio"] = row["inter_token_p50_ms"] / base["inter_token_p50_ms"]
        one, one_base = row["one_process"], base["one_process"]
        one["tokens_per_s_ratio"] = one["tokens_per_s"] / one_base["tokens_per_s"]
        one["inter_token_ratio"] = one["inter_token_p50_ms"] / one_base["inter_token_p50_ms"]
        row["share_of_one_process"] = row["tokens_per_s"] / one["tokens_per_s"]
    print_table(f"Concurrent generations through continuous batching ({model_id}, q8_0 wire, {max_new} new tokens "
                f"each; reference: concurrency {base['concurrency']} in this run)",
                ["concurrency", "aggregate tokens/s", "x ref", "inter-token p50 ms", "x ref", "p99 ms",
                 "iterations", "largest batch", "holder requests / layer / iteration", "decode: dense ms",
                 "MoE layers ms", "of which holder compute ms"],
                [[r["concurrency"], round(r["tokens_per_s"], 1), f"{r['tokens_per_s_ratio']:.2f}x",
                  round(r["inter_token_p50_ms"], 1), f"{r['inter_token_ratio']:.2f}x",
                  round(r["inter_token_p99_ms"], 1), round(r["iterations"], 1), r["largest_batch"],
                  round(r["holder_requests_per_layer_iteration"], 2), round(r["dense_ms"], 1), round(r["moe_ms"], 1),
                  round(r["holder_ms"], 1)]
                 for r in rows])
    print_table(f"The same prompts batched in one process, no network (the ceiling of batching on this machine; "
                f"reference: its own concurrency {base['concurrency']})",
                ["concurrency", "one process tokens/s", "x its ref", "inter-token p50 ms", "x its ref",
                 "decode: dense ms", "MoE layers ms", "distributed tokens/s / one process"],
                [[r["concurrency"], round(r["one_process"]["tokens_per_s"], 1),
                  f"{r['one_process']['tokens_per_s_ratio']:.2f}x", round(r["one_process"]["inter_token_p50_ms"], 1),
                  f"{r['one_process']['inter_token_ratio']:.2f}x", round(r["one_process"]["dense_ms"], 1),
                  round(r["one_process"]["moe_ms"], 1), f"{r['share_of_one_process']:.2f}"] for r in rows])
    print("targets: aggregate tokens/s at 16 >= 6x one sequence; inter-token p50 <= 2.5x; holder requests <= 1")
    return rows
