"""Whole-model generation benchmark: greedy decode over real nodes on loopback against one process.

    .venv/bin/python -m bench.generate [--quick] [--shapes 2x128,24x16] [--vocab N] [--profile] [--rounds N]
                                       [--concurrency 1,4,16] [--holders N] [--replication R]

What is measured, and how. Qwen3-MoE checkpoints at Qwen3-30B-A3B's widths (bench/_generate_model.py):
`2x128`, two MoE layers of the real 128 experts, and `24x16`, 24 MoE layers of 16 experts, so a deep
model's cost per layer shows. Q8_0 experts, top-8, the LM head at its real share of a step.

Distributed: real node processes (`tenzro node run`, testkit.nodes) on a redis-server of their own,
as bench/forward.py starts them: a router that loads each model's dense part and gates
(`tenzro_moeLoadDense {model_id, checkpoint}`) and holds no expert, so every (token, expert) pair
crosses the wire, and N holders (`--holders N`, 4 by default), expert e of each layer on holder e % N
(replication 1: a speed benchmark; failover is tested elsewhere; `--replication R` puts expert e on holders
e, e + 1, ... modulo N, and the planner chooses; "requests/layer" says how many holders a layer asked).
Once the router's shard map shows every expert held, `tenzro_moeGenerate` runs a 32-token prompt to
`max_new_tokens` (stop_at_eos false) with Q8_0 (and, for 2x128, f32) activations on the wire; TTFT and
decode tokens/s are the generation record's
(`ttft_ms`: the prefill; `decode_tokens_per_s`: decoded tokens over the decode's wall time). The
reference is the same model in this process: apps.generation.model.WholeModel with
ExpertRuntime.forward_local holding every expert (the same payloads), timed as greedy_generate runs
it, interleaved with the distributed generations so drift hits both alike: each of `--rounds` rounds (6 by
default) runs the one process and each wire, in an order rotated by one each round (`rotations`), and every
figure is the median over the rounds. One round decides little on a shared machine: in 40 comparisons of the
unchanged node, each one one-process generation against the median of three through the nodes
(docs/performance.md, "A knob at a time, within one run"), the decode ratio read 0.36x to 0.81x, as the one
process alone ran at 44 to 96 tokens/s and the nodes at 25 to 47.

Where decode time goes, from the decode steps of the records: router dense compute = each step's
`dense_ms` (the dense part as the router's compute thread timed it; the one process's is its step
minus its MoE time); holder compute = per MoE layer, the largest compute_ms one holder reported (the
critical path, if the holders ran side by side); network + dispatch = the rest of each MoE layer's ms
(gate and plan on the router, codec, QUIC, the holders' queueing, receipts, combine), reported per
MoE layer per step; hedges fired and won per remote batch. All processes share this machine's cores,
so the holders' compute competes with the router and the transport as it would on one host. "cores
busy" says how much: the CPU seconds every node process used during a generation (router and holders,
each with its web, Celery and expert workers), over the generation's wall time, then the same for the
whole machine (this process, Redis and the kernel's network stack too). Near the core count, a layer's
network + dispatch is mostly requests and answers waiting for a core while other holders compute
(docs/performance.md, "A decode layer on two shared cores, process by process"); "preempted / token"
counts how often the nodes' threads lost a core they could still use (involuntary context switches),
per new token: a send that wakes a holder on shared cores often hands that holder the sender's
core (docs/performance.md, "Sends that hand the core away").
Where TTFT goes, round by round (`ttft_split` in the JSON): the wait before the first step, the prompt's
dense part and its MoE layers, against the one process's dense part and MoE; the rounds of one run differ by
up to half on these shared VMs, and the split says whether the dense part or the layers moved.
`--profile` samples the router's and one holder's expert worker with py-spy during one decode
generation of the first shape and prints where their threads' CPU went (bench/_pyspy.py); where
py-spy cannot attach, each worker cProfiles its own event loop (TENZRO_PROFILE_DIR, set for the nodes).
"""

from __future__ import annotations

import os

# As bench/forward.py: OpenBLAS threads that spin after each call would starve the node processes.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import testkit.nodes
from testkit.nodes import TOKEN, NodeProcess, Usage, usage_of
from testkit.redis_server import RedisNode, private_redis

from . import _concurrency, _pyspy
from ._generate_model import (
    D_FF,
    D_MODEL,
    N_HOLDERS,
    REAL_VOCAB,
    TOP_K,
    Local,
    Shape,
    dense_ms_per_token,
    holders_of,
    write_model,
)
from .forward import NODE_ENV, _stop
from .report import RESULTS_DIR, headline, print_table, write_results

PROMPT_TOKENS = 32
TARGETS = {"network_ms_per_layer": 2.0, "decode_ratio": 0.6, "ttft_ratio": 1.5, "dense_ratio": 1.2,
           "hedged_share": 0.05}


def start_nodes(work: Path, redis_host: str, nodes: list[NodeProcess], holders: int = N_HOLDERS, *,
                router: bool = True) -> None:
    """Router, then `holders` holders (four by default), on databases 1, 2, ... of a Redis server of their
    own, started in parallel; `router` false: the holders alone, with no peers. Each is in `nodes` before it
    starts, so that a start that fails still stops the others."""
    # Five nodes compiling and migrating at once on a shared 2-core machine can take longer than the
    # tests' 90 s: testkit.nodes reads this at each wait.
    testkit.nodes.START_TIMEOUT_S = max(testkit.nodes.START_TIMEOUT_S, 300.0)
    if router:
        nodes.append(RedisNode(data_dir=work / "router", redis_db=1, redis_host=redis_host))
    peers = [nodes[0].url] if router else []
    nodes.extend(RedisNode(data_dir=work / f"holder{i}", redis_db=2 + i, redis_host=redis_host, peers=peers)
                 for i in range(holders))
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda n: n.start(**NODE_ENV), nodes))


def load_experts(holders: list[NodeProcess], experts: list[Path], replication: int = 1) -> None:
    """Each holder loads its experts (holders_of), the holders at once."""
    work: dict[int, list[Path]] = {i: [] for i in range(len(holders))}
    for path in experts:
        for i in holders_of(path, len(holders), replication):
            work[i].append(path)

    def load_holder(i: int) -> None:
        for path in work[i]:
            answer = holders[i].rpc("tenzro_moeExpertLoad", {"path": str(path)}, token=TOKEN, timeout=120)
            assert "result" in answer, answer

    with ThreadPoolExecutor(len(holders)) as pool:
        list(pool.map(load_holder, range(len(holders))))


def load(nodes: list[NodeProcess], shape: Shape, folder: Path, experts: list[Path], replication: int = 1
         ) -> dict[str, Any]:
    """Dense part and gates on the router while each holder loads its experts."""
    router, holders = nodes[0], nodes[1:]
    with ThreadPoolExecutor(2) as pool:
        dense = pool.submit(router.rpc, "tenzro_moeLoadDense", {"model_id": shape.model_id,
                                                                "checkpoint": str(folder)}, token=TOKEN, timeout=600)
        pool.submit(load_experts, holders, experts, replication).result()
        answer = dense.result()
    assert "result" in answer, answer
    return answer["result"]


def wait_converged(router: NodeProcess, model_id: str, n_experts: int, replication: int = 1,
                   timeout_s: float = 180.0) -> float:
    """Seconds until the router's shard map shows every expert held `replication` times, each holder with a
    QUIC door."""
    started, seen = time.monotonic(), 0
    while time.monotonic() - started < timeout_s:
        shard = router.result("tenzro_moeShardMap", {"model_id": model_id})["holders"]
        seen = len(shard)
        if seen == n_experts and all(len(e["holders"]) >= replication and all(h["quic_endpoint"] for h in e["holders"])
                                     for e in shard):
            return time.monotonic() - started
        time.sleep(1.0)
    raise RuntimeError(f"the router saw {seen} of {n_experts} experts held within {timeout_s} s")


def generate(router: NodeProcess, model_id: str, prompt: list[int], max_new: int, wire: str, *,
             machine: list[NodeProcess] | None = None) -> dict[str, Any]:
    """The generation's record; with `machine`, also `cores_busy`: the CPU seconds every process of those
    nodes used during the call, over its wall seconds; `machine_busy`: the same for every process and the
    kernel (what this machine's cores were not idle for); `preempted_per_token`: how many times the nodes'
    threads lost a core they could still use (psutil's involuntary context switches), per new token."""
    before, busy_before, started = nodes_usage(machine or []), busy_core_seconds(), time.monotonic()
    answer = router.rpc("tenzro_moeGenerate", {"model_id": model_id, "prompt_ids": prompt, "max_new_tokens": max_new,
                                               "stop_at_eos": False, "wire": wire, "wait": True},
                        token=TOKEN, timeout=600)
    assert "result" in answer, str(answer)[:500]
    record = answer["result"]
    assert record["state"] == "done", record.get("error")
    if machine:
        after, wall = nodes_usage(machine), time.monotonic() - started
        record["cores_busy"] = (after.cpu_s - before.cpu_s) / wall
        record["machine_busy"] = (busy_core_seconds() - busy_before) / wall
        record["preempted_per_token"] = (after.involuntary_switches - before.involuntary_switches) / max_new
    return record


def nodes_usage(nodes: list[NodeProcess]) -> Usage:
    """The nodes' processes' usage so far, summed (one walk of each node's process tree)."""
    return usage_of([pid for n in nodes for pid in n.pids()])


def busy_core_seconds() -> float:
    """Core seconds this machine's cores spent on anything but idling (user, system, interrupts, steal)."""
    times = psutil.cpu_times()
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def split(records: list[dict[str, Any]], router_id: str) -> dict[str, float]:
    """Per decode step and per MoE layer, where the distributed decode's time went (ms), and its hedging."""
    steps = [s for r in records for s in r["steps"] if s["phase"] == "decode"]
    layers = [layer for s in steps for layer in s["layers"]]
    critical = [max((h["compute_ms"] or 0.0 for h in layer["holders"]), default=0.0) for layer in layers]
    remote = [h for layer in layers for h in layer["holders"] if h["provider"] != router_id]
    batches = sum(h["batches"] for h in remote) or 1
    return {
        "steps": len(steps), "step_ms": statistics.fmean(s["ms"] for s in steps),
        "dense_ms": statistics.fmean(s["dense_ms"] for s in steps),
        "moe_ms_per_layer": statistics.fmean(layer["ms"] for layer in layers),
        "holder_ms_per_layer": statistics.fmean(critical),
        "network_ms_per_layer": statistics.fmean(layer["ms"] - c for layer, c in zip(layers, critical, strict=True)),
        "requests_per_layer": statistics.fmean(len(layer["holders"]) for layer in layers),
        "batches_per_layer": batches / len(layers),
        "hedges_fired": sum(layer["hedges_fired"] for layer in layers) / batches,
        "hedges_won": sum(layer["hedges_won"] for layer in layers) / batches,
        "cores_busy": statistics.median(r["cores_busy"] for r in records),
        "machine_busy": statistics.median(r["machine_busy"] for r in records),
        "preempted_per_token": statistics.median(r["preempted_per_token"] for r in records),
    }


def ttft_parts(record: dict[str, Any]) -> dict[str, float]:
    """Where one distributed generation's TTFT went (ms): the wait before its first step (the queue, the
    record's creation), then the first step's dense part and its MoE layers (each layer's wall time)."""
    first = record["steps"][0]
    moe = sum(layer["ms"] for layer in first["layers"])
    return {"ttft_ms": record["ttft_ms"], "before_ms": record["ttft_ms"] - first["ms"], "dense_ms": first["dense_ms"],
            "moe_ms": moe, "other_ms": first["ms"] - first["dense_ms"] - moe}


def ttft_table(shape: Shape, runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, float]]]:
    """Prints and returns each run's TTFT split (prefill), one process's first, so that a TTFT ratio off its
    target says which part moved: the prompt's dense part, its MoE layers, or the wait before them."""
    out: dict[str, list[dict[str, float]]] = {"local": [
        {"ttft_ms": r["ttft_ms"], "before_ms": 0.0, "dense_ms": r["ttft_ms"] - r["prefill_moe_ms"],
         "moe_ms": r["prefill_moe_ms"], "other_ms": 0.0} for r in runs["local"]]}
    out |= {wire: [ttft_parts(r) for r in recs] for wire, recs in runs.items() if wire != "local"}
    rows = [["one process" if wire == "local" else f"router, {wire}", i + 1,
             *(p[k] for k in ("ttft_ms", "before_ms", "dense_ms", "moe_ms", "other_ms"))]
            for wire, parts in out.items() for i, p in enumerate(parts)]
    print_table(f"{shape.name}: where each generation's TTFT went (ms), round by round: before its first step (the "
                f"queue, the record), the {PROMPT_TOKENS}-token prompt's dense part (the router's compute thread; one "
                "process: the step less its MoE), its MoE layers (each layer's wall time), the rest of the step",
                ["run", "round", "TTFT", "before", "dense", "MoE layers", "other"], rows)
    return out


def run_shape(shape: Shape, args: argparse.Namespace, work: Path, nodes: list[NodeProcess],
              rng: np.random.Generator) -> dict[str, Any]:
    t0 = time.monotonic()
    folder, experts = write_model(work / shape.name, shape, rng)
    router = nodes[0]
    dense = load(nodes, shape, folder, experts, args.replication)
    local = Local(shape, folder, experts, work / f"local-{shape.name}")
    converged = wait_converged(router, shape.model_id, len(experts), args.replication)
    print(f"\n[{shape.name}] checkpoint + {len(experts)} Q8_0 payloads written and loaded "
          f"{time.monotonic() - t0:.0f} s (dense part {dense['dense_bytes'] / 1e6:.0f} MB f32), every expert "
          f"seen by the router {converged:.0f} s later")
    wires = ("q8_0", "f32") if shape.layers <= 2 else ("q8_0",)
    max_new, rounds = (8, 1) if args.quick else (16, args.rounds)
    prompt = [int(t) for t in rng.integers(0, shape.vocab_size, PROMPT_TOKENS)]
    local.generate(prompt, 2)  # warm: kernels, page cache
    for wire in wires:  # warm: QUIC connections, the hedging book's per-holder latencies
        for _ in range(1 if args.quick else 3):
            generate(router, shape.model_id, prompt, max_new, wire)
    runs: dict[str, list[dict[str, Any]]] = {"local": [], **{w: [] for w in wires}}
    for order in rotations(["local", *wires], rounds):
        for name in order:
            runs[name].append(local.generate(prompt, max_new) if name == "local"
                              else generate(router, shape.model_id, prompt, max_new, name, machine=nodes))
    profile = None
    if args.profile:
        profile = profiled(nodes, shape, prompt, max_new)
    batched = None
    if args.concurrency:
        levels = [int(n) for n in args.concurrency.split(",")]
        batched = _concurrency.concurrency(router, nodes[1:], local, shape.model_id, levels, shape.vocab_size,
                                           max_new, shape.layers, rng, profile=args.profile)
    local.close()
    return {"shape": shape.name, "model_id": shape.model_id, "vocab_size": shape.vocab_size,
            "dense_bytes": dense["dense_bytes"], **tables(shape, runs, router.result("tenzro_nodeInfo")["provider_id"],
                                                             len(nodes) - 1),
            "profile": profile, "concurrency": batched}


def rotations(names: list[str], rounds: int) -> list[list[str]]:
    """Each round's order of the runs: `names` rotated by one more each round, so that over a multiple of
    len(names) rounds each run has every place in a round equally often, and whatever one run leaves for the
    next (a generation's settlement and records on the nodes, the one process's reads through the caches)
    falls on each alike. In a fixed order the f32 wire always followed the q8_0 one, and its dense part read
    up to 2.06x one process where the q8_0 wire's read 1.37x; alternated within one run, the two wires' dense
    parts, the same computation, took the same time (12.8 and 13.0 ms)."""
    return [names[r % len(names):] + names[:r % len(names)] for r in range(rounds)]


def profiled(nodes: list[NodeProcess], shape: Shape, prompt: list[int], max_new: int) -> dict[str, Any]:
    """One q8_0 generation while py-spy samples the router's and a holder's expert workers."""
    seconds = 12.0
    spies = {name: _pyspy.Profile(node.result("tenzro_workerStatus")["pid"], RESULTS_DIR / f"profile-{name}.txt",
                                  seconds) for name, node in (("router", nodes[0]), ("holder", nodes[1]))}
    started, steps = time.monotonic(), 0
    while time.monotonic() - started < seconds - 1:
        steps += len(generate(nodes[0], shape.model_id, prompt, max_new, "q8_0")["steps"])
    out = {name: spy.finish(steps=steps) for name, spy in spies.items()}
    for name, summary in out.items():
        print_table(f"Profile of the {name}'s expert worker over {steps} steps of {shape.name} (q8_0): CPU ms per "
                    f"step by thread (/proc), then the event loop's busy functions (py-spy samples, or its own "
                    f"cProfile where py-spy cannot attach; raw: {summary['raw']})",
                    ["thread / frame", "ms per step / share"],
                    [*([k, v] for k, v in summary["cpu_ms_per_step"].items()),
                     *([f, f"{share:.1%}"] for f, share in summary["event_loop_busy"])])
    return out


def tables(shape: Shape, runs: dict[str, list[dict[str, Any]]], router_id: str, holders: int) -> dict[str, Any]:
    ref = runs["local"]
    ref_ttft = statistics.median(r["ttft_ms"] for r in ref)
    ref_tps = statistics.median(r["decode_tokens_per_s"] for r in ref)
    ref_steps = [s for r in ref for s in r["decode_step_ms"]]
    ref_dense = dense_ms_per_token(ref)
    want = ref[0]["tokens"]
    rows = [["one process", "-", ref_ttft, "1.00x", ref_tps, "1.00x", statistics.fmean(ref_steps), ref_dense,
             "1.00x", "-", "-", "-", "-", "-", "-", f"{len(want)}/{len(want)}"]]
    record: dict[str, Any] = {"local": {"ttft_ms": ref_ttft, "decode_tokens_per_s": ref_tps,
                                        "dense_ms_per_token": ref_dense, "runs": ref}}
    for wire, recs in runs.items():
        if wire == "local":
            continue
        ttft = statistics.median(r["ttft_ms"] for r in recs)
        tps = statistics.median(r["decode_tokens_per_s"] for r in recs)
        where = split(recs, router_id)
        same = min(sum(a == b for a, b in zip(r["tokens"], want, strict=True)) for r in recs)
        rows.append([f"router + {holders} holder{'s' if holders > 1 else ''}", wire, ttft,
                     f"{ttft / ref_ttft:.2f}x", tps, f"{tps / ref_tps:.2f}x", where["step_ms"], where["dense_ms"],
                     f"{where['dense_ms'] / ref_dense:.2f}x", where["network_ms_per_layer"],
                     where["holder_ms_per_layer"], where["requests_per_layer"],
                     f"{where['hedges_fired']:.1%} / {where['hedges_won']:.1%}",
                     f"{where['cores_busy']:.2f} / {where['machine_busy']:.2f} of {os.cpu_count()}",
                     where["preempted_per_token"], f"{same}/{len(want)}"])
        record[wire] = {"ttft_ms": ttft, "decode_tokens_per_s": tps, "one_process_ttft_ms": ref_ttft,
                        "one_process_decode_tokens_per_s": ref_tps, "one_process_dense_ms_per_token": ref_dense,
                        "tokens_equal_local": same, "split": where, "records": recs}
    print_table(
        f"{shape.name}: greedy generation, Qwen3-MoE at Qwen3-30B-A3B widths, {shape.layers} MoE layers of "
        f"{shape.experts} experts (top-{TOP_K}, d_model {D_MODEL}, d_ff {D_FF}, Q8_0), vocab {shape.vocab_size:,}; "
        f"{PROMPT_TOKENS}-token prompt, {len(want)} new tokens; medians over {len(ref)} round(s); per decode step: "
        "ms, router dense compute (dense_ms) and its ratio to one process; per MoE layer: network + dispatch ms "
        "(layer ms - the slowest holder's compute), that holder compute and the holders asked (requests); "
        "hedges fired / won per remote batch; "
        "cores busy: every node process's CPU, then the whole machine's, over the generation's wall time; "
        "preempted: the node threads' involuntary context switches per new token",
        ["run", "wire", "TTFT ms", "TTFT ratio", "decode tok/s", "decode ratio", "step ms", "dense ms",
         "dense ratio", "net ms/layer", "holder ms/layer", "requests/layer", "hedged / won",
         "cores busy: nodes / machine", "preempted / token", "tokens = one process"], rows)
    return {"generation": record, "ttft_split": ttft_table(shape, runs)}


def variants(plan: list[Shape], holder: NodeProcess, holders: int, replication: int) -> dict[str, Any]:
    status = holder.result("tenzro_moeExpertStatus", {"live": True})
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    return {
        "holder backend": f"{status['backend']} (cpu kernel {status['cpu_kernel']})",
        "shapes": ", ".join(f"{s.name} (vocab {s.vocab_size:,}"
                            f"{'' if s.vocab else f', the real {REAL_VOCAB:,} x layers / 48'})" for s in plan),
        "f32 matmul": f"numpy {np.__version__}, BLAS {blas.get('name', '?')} {blas.get('version', '')}".strip(),
        "replication": f"{replication} (expert e on holder{'s' if replication > 1 else ''} "
                       f"{', '.join(f'(e + {i}) % {holders}' if i else f'e % {holders}' for i in range(replication))}; "
                       "the router holds none)",
        "cores": os.cpu_count(),
        "load average (1, 5, 15 min) at start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only 2x128, 8 new tokens, 1 round (a smoke run)")
    parser.add_argument("--shapes", default="2x128,24x16", help="LAYERSxEXPERTS, comma-separated")
    parser.add_argument("--vocab", type=int, default=None, help="vocab_size instead of the real share "
                        f"({REAL_VOCAB:,} is Qwen3-30B-A3B's: 2.5 GB f32 of embedding and LM head)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the router and a holder during a decode (py-spy, else their loops' cProfile)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="rounds of one process and each wire, in a rotated order; figures are medians over them")
    parser.add_argument("--replication", type=int, default=1,
                        help="holders of each expert: e on holders e, e + 1, ... modulo N (1, the default: as the "
                             "targets are set; more: the planner chooses among them)")
    parser.add_argument("--holders", type=int, default=N_HOLDERS,
                        help="holder nodes, expert e on holder e %% N (1: one holder's round trip with no other "
                        "holder competing for the cores)")
    parser.add_argument("--concurrency", default="", help="e.g. 1,4,16: that many generations at once on the "
                        "first shape, through continuous batching (bench/_concurrency.py)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.replication < 1:
        parser.error(f"--replication must be at least 1, got {args.replication}")
    args.replication = min(args.replication, args.holders)  # no holder loads an expert twice
    plan = [Shape.parse(s, args.vocab) for s in ("2x128" if args.quick else args.shapes).split(",")]
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-generate-"))
    if args.profile:  # the nodes inherit it: their fallback when py-spy cannot attach
        os.environ.setdefault("TENZRO_PROFILE_DIR", str(RESULTS_DIR / "loop-profiles"))
    nodes: list[NodeProcess] = []
    try:
        with private_redis() as redis_host:
            try:
                start_nodes(work, redis_host, nodes, args.holders)
                print(f"{len(nodes)} nodes started {time.monotonic() - started:.0f} s")
                facts = variants(plan, nodes[1], args.holders, args.replication)
                print_table("Variants that ran", ["what", "value"], [[k, v] for k, v in facts.items()])
                rng = np.random.default_rng(0)
                shapes = [run_shape(shape, args, work, nodes, rng) for shape in plan]
                results = {"quick": args.quick, "variants": facts, "shapes": shapes, "targets": TARGETS,
                           "wall_s": time.monotonic() - started, "load_average_at_end": os.getloadavg()}
                print(f"\nload average (1, 5, 15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
                      f"ran {results['wall_s']:.0f} s")
                write_results("generate", results, headlines(shapes))
            finally:
                with ThreadPoolExecutor(max(1, len(nodes))) as pool:
                    list(pool.map(_stop, nodes))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def headlines(shapes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for shape in shapes:
        for wire, g in shape["generation"].items():
            if wire == "local":
                continue
            name = f"{shape['shape']} {wire}"
            out += [headline(f"generation TTFT, {name}", g["ttft_ms"], "ms", reference="one process",
                             reference_value=g["one_process_ttft_ms"], target="<= 1.5x"),
                    headline(f"generation decode, {name}", g["decode_tokens_per_s"], "tokens/s",
                             reference="one process", reference_value=g["one_process_decode_tokens_per_s"],
                             target=">= 0.6x"),
                    headline(f"router dense compute per token, {name}", g["split"]["dense_ms"], "ms",
                             reference="one process", reference_value=g["one_process_dense_ms_per_token"],
                             target="<= 1.2x"),
                    headline(f"network + dispatch per MoE layer, {name}", g["split"]["network_ms_per_layer"], "ms",
                             target="<= 2 ms"),
                    headline(f"batches hedged, {name}", 100.0 * g["split"]["hedges_fired"], "%", target="<= 5 %")]
    return out


if __name__ == "__main__":
    main()
