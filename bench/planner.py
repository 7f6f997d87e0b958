"""Shard map and dispatch planner benchmark: time per plan and per shard map against targets.

Run: .venv/bin/python -m bench.planner

Views are synthetic (testkit.shard_views): 1,000 providers; every expert of every MoE
layer held by 8 distinct random providers, 75% of holdings Warm, 25% of providers with a
GPU, per-provider committed_tps log-normal around 300 tokens/s, latency log-normal around
20 ms (10% unmeasured). Routings: 4,096 tokens, top-k over Zipf-weighted Gumbel noise
(a few hot experts), plus the shared experts on every token.

Planning table: one layer (layer 0) planned against an index of the WHOLE model, built
once (its build time is its own column, as a forward builds it once per view change).
"json" is plan_dispatch (the routings of docs/specification.md in, the JSON shape out: what
tenzro_moePlanDispatch runs); "arrays" is plan_pairs (flat pair arrays in, a columnar plan
out: what the distributed forward runs). Times are the wall-clock median of REPEAT runs,
the best in brackets, then the median process CPU time ("cpu"), which a machine shared with
other work inflates least. Ratios and "met" use the wall-clock median. "max share" is the
largest fraction of the layer's pairs one provider was given.

Decode table: the same plan_pairs for one token (and sixteen, a batch of sequences) x top-k,
against the same whole-model index: what every MoE layer of every decode step plans, as a share
of the 2 ms a layer's network and dispatch may take (bench/generate.py's target), target <= 10%.
Beside it, the same plan with every provider's wire time per byte measured (log-normal around
30 ns, 10% unmeasured) and a Q8_0 row of d_model 2048 there and back (row_bytes 4,352): what the
distributed forward plans once its holders have moved large answers (core/shardmap/planner.py),
as a ratio to the plan without, in the same run.

Decode dispatch table: a decode step's whole router-side machinery around the wire for one layer,
1 token x top-8 of Qwen3-30B-A3B: plan_pairs, apps/forward/engine.run_forward (failover and hedging
armed, nothing failing) and the gate-weighted combine, with in-process holders that answer at once
(no codec, no QUIC, no compute), on the index bench/generate.py builds (128 experts on 1 or 4
holders) and on the whole-model one. Each holder is called the two ways the engine knows: one request per
batch (a holder on the single-expert frame) and one request per holder (the multi-expert frame,
served by one attempt per request); the ratio is the second to the first, measured in the same run.

Record table: verifying one signed provider record with 500 holdings beside a bare ed25519
verify (64 bytes, and the record's own bytes).

Shard map table: the shard map of a whole Kimi-K3-sized model from the plain view
(shard_map: index build + the JSON shape), median of a few runs.

Targets are ratios: time / target, met when <= 1. Machines differ: this is wall-clock on
whatever CPU runs it (the planner is single-threaded Python + numpy).

Extending: write a function that prints its table and returns its rows as a list of dicts,
and add it to TABLES; main() runs them in order and writes them all to
bench/results/planner.json under their names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from nacl.signing import VerifyKey

from apps.forward.combine import StreamingCombine
from apps.forward.engine import ForwardLimits, run_forward
from apps.forward.hedging import LatencyBook
from apps.forward.report import Answer
from apps.providers.records import RECORD_DOMAIN, verify_record
from core.shardmap.aggregation import shard_map
from core.shardmap.index import ShardIndex
from core.shardmap.planner import plan_dispatch, plan_pairs
from testkit.records import holdings as record_holdings
from testkit.records import new_key, signed_record
from testkit.shard_views import (
    MODEL,
    POLICY,
    holding,
    provider,
    routings_json,
    routings_pairs,
    skewed_routings,
    synthetic_view,
)

from .report import Timing, headline, print_table, timed, write_results

PLAN_TARGET_S = 0.020
DECODE_LAYER_BUDGET_S = 0.002  # network + dispatch of one MoE layer of a decode step (bench/generate.py's target)
DECODE_PLAN_SHARE = 0.10
ROW_BYTES = 2 * 2176  # a Q8_0 row of d_model 2048 (64 blocks of 34 bytes), request and answer
SHARD_MAP_TARGET_S = 1.0
N_PROVIDERS = 1000
N_TOKENS = 4096
REPLICAS = 8
REPEAT = 9


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    routed: int
    top_k: int
    shared: int


# Counts from docs/specification.md, "Model catalog" ("Qwen 3 30B-A3B (128/8)", "Kimi K3 (896/16 + 2)");
# Qwen3-30B-A3B's 48 layers from its config.json (apps.catalog.shapes); Kimi K3's layer count is not
# published in the sources available here, so it takes Kimi K2's 61 (60 MoE + 1 dense, all 61 counted:
# the larger case).
QWEN3_30B = Model("Qwen3-30B-A3B", layers=48, routed=128, top_k=8, shared=0)
KIMI_K3 = Model("Kimi-K3-sized", layers=61, routed=896, top_k=16, shared=2)
# The planning target is stated for top-8 on both layers; Kimi K3 itself routes 16.
KIMI_K3_TOP8 = Model("Kimi-K3-sized", layers=61, routed=896, top_k=8, shared=2)


def view_of(model: Model, seed: int):
    rng = np.random.default_rng(seed)
    return synthetic_view(rng, n_providers=N_PROVIDERS, layers=range(model.layers),
                          n_experts=model.routed + model.shared, replicas=REPLICAS)


def planning() -> list[dict[str, Any]]:
    rows, table = [], []
    views: dict[str, Any] = {}
    for model in (QWEN3_30B, KIMI_K3_TOP8, KIMI_K3):
        view = views.setdefault(model.name, view_of(model, seed=1))
        build, index = timed(lambda v=view: ShardIndex.build(MODEL, v.providers, v.holdings, POLICY), 3)
        experts = skewed_routings(np.random.default_rng(2), n_tokens=N_TOKENS, n_routed=model.routed,
                                  top_k=model.top_k, n_shared=model.shared, skew=1.0)
        routings = routings_json(experts)
        tokens, layers, expert_ids = routings_pairs(experts)
        plan_pairs(tokens, layers, expert_ids, index)  # first call converts the index's columns (cached)
        json_t, plan = timed(lambda r=routings, i=index: plan_dispatch(r, i), REPEAT)
        arr_t, _ = timed(lambda t=tokens, la=layers, e=expert_ids, i=index: plan_pairs(t, la, e, i), REPEAT)

        per_provider: dict[str, int] = {}
        for batch in plan["batches"]:
            per_provider[batch["provider"]] = per_provider.get(batch["provider"], 0) + len(batch["token_indices"])
        pairs = int(tokens.size)
        row = {"model": model.name, "pairs": pairs, "holdings": len(view.holdings),
               "index_build": build.to_dict(), "json": json_t.to_dict(), "arrays": arr_t.to_dict(),
               "target_ms": PLAN_TARGET_S * 1e3, "json_ratio": json_t.median_s / PLAN_TARGET_S,
               "arrays_ratio": arr_t.median_s / PLAN_TARGET_S, "batches": len(plan["batches"]),
               "unroutable": len(plan["unroutable"]), "providers_used": len(per_provider),
               "max_share": max(per_provider.values()) / pairs}
        rows.append(row)
        table.append([model.name, f"{N_TOKENS}x{model.top_k}+{model.shared}", row["holdings"],
                      build.median_s * 1e3, json_t.cell(), row["target_ms"], row["json_ratio"], row["json_ratio"] <= 1,
                      arr_t.cell(), row["arrays_ratio"], row["arrays_ratio"] <= 1, row["batches"], row["unroutable"],
                      row["providers_used"], row["max_share"]])
    print_table(f"Dispatch planning, one layer, {N_PROVIDERS} providers, index of the whole model (ms)",
                ["model", "tokens x k", "holdings", "index build", "json [best] cpu", "target", "json/target", "met",
                 "arrays [best] cpu", "arrays/target", "met", "batches", "unroutable", "providers", "max share"], table)
    return rows


def decode_planning() -> list[dict[str, Any]]:
    """A decode step's plan: 1 token (and 16, a batch of sequences) x top-k of one layer, against the
    index of the whole model, as the distributed forward plans every MoE layer of every step. Beside
    it the per-layer budget of a decode step's network and dispatch (DECODE_LAYER_BUDGET_S), of which
    planning is one part."""
    rows, table = [], []
    for model in (QWEN3_30B, KIMI_K3):
        view = view_of(model, seed=1)
        index = ShardIndex.build(MODEL, view.providers, view.holdings, POLICY)
        wired = ShardIndex.build(MODEL, _with_wire(view.providers, np.random.default_rng(5)), view.holdings, POLICY)
        for n_tokens in (1, 16):
            experts = skewed_routings(np.random.default_rng(4), n_tokens=n_tokens, n_routed=model.routed,
                                      top_k=model.top_k, n_shared=model.shared, skew=1.0)
            tokens, layers, expert_ids = routings_pairs(experts)
            plan_pairs(tokens, layers, expert_ids, index)  # the index's columns, converted once
            plan_pairs(tokens, layers, expert_ids, wired, row_bytes=ROW_BYTES)
            took, plan = timed(lambda t=tokens, la=layers, e=expert_ids, i=index: plan_pairs(t, la, e, i), 200)
            with_wire, _ = timed(lambda t=tokens, la=layers, e=expert_ids, i=wired:
                                 plan_pairs(t, la, e, i, row_bytes=ROW_BYTES), 200)
            share = took.median_s / DECODE_LAYER_BUDGET_S
            rows.append({"model": model.name, "tokens": n_tokens, "pairs": int(tokens.size), **took.to_dict(),
                         "batches": len(plan.batches), "budget_ms": DECODE_LAYER_BUDGET_S * 1e3, "share": share,
                         "with_wire": with_wire.to_dict(), "with_wire_ratio": with_wire.median_s / took.median_s})
            table.append([model.name, f"{n_tokens}x{model.top_k}+{model.shared}", len(view.holdings),
                          f"{took.median_s * 1e6:.0f} [{took.best_s * 1e6:.0f}] cpu {took.cpu_s * 1e6:.0f}",
                          len(plan.batches), f"{share:.1%}", share <= DECODE_PLAN_SHARE,
                          f"{with_wire.median_s * 1e6:.0f} [{with_wire.best_s * 1e6:.0f}]",
                          f"{with_wire.median_s / took.median_s:.2f}x"])
    print_table(f"A decode step's plan, one layer, {N_PROVIDERS} providers, index of the whole model (µs); "
                f"share of the {DECODE_LAYER_BUDGET_S * 1e3:.0f} ms a layer's network and dispatch may take, "
                f"target ≤ {DECODE_PLAN_SHARE:.0%}; and with the wire weighed (row_bytes {ROW_BYTES})",
                ["model", "tokens x k", "holdings", "arrays µs [best] cpu", "batches", "share of budget", "met",
                 "with wire µs [best]", "× without"], table)
    return rows


def _with_wire(providers: list[Any], rng: np.random.Generator) -> list[Any]:
    """The providers with a measured wire time per byte: log-normal around 30 ns, 10% unmeasured."""
    wire = np.exp(rng.normal(np.log(30.0), 0.5, len(providers)))
    unmeasured = rng.random(len(providers)) < 0.1
    return [replace(p, wire_ns_per_byte=None if u else float(w))
            for p, w, u in zip(providers, wire.tolist(), unmeasured.tolist(), strict=True)]


class InstantHolders:
    """The engine's BatchExecutor with holders in this process that answer at once with the rows they
    were sent: what is left is the router's own machinery. `gather`: one request per holder."""

    def __init__(self, gather: bool) -> None:
        self.gather = gather

    def gathers(self, holder: Any) -> bool:
        return self.gather

    async def __call__(self, holder: Any, layer: int, expert: int, rows: np.ndarray, tokens: np.ndarray) -> Answer:
        await asyncio.sleep(0)  # the answer comes in a later turn of the loop, as off the wire
        return Answer(rows, transport="quic", compute_s=0.0)

    async def many(self, holder: Any, layer: int, calls: list[tuple[int, np.ndarray, np.ndarray]],
                   lane: int = 0) -> list[Answer]:
        await asyncio.sleep(0)
        return [Answer(rows, transport="quic", compute_s=0.0, request=id(calls)) for _, rows, _ in calls]


def _time_forwards(index: ShardIndex, model: Model, executor: InstantHolders, repeat: int) -> Timing:
    """plan + run_forward + combine of one token x top-k of layer 0, `repeat` times in one event loop."""
    rng = np.random.default_rng(5)
    hidden = rng.standard_normal((1, 2048), dtype=np.float32)
    book, limits = LatencyBook(), ForwardLimits()

    async def one() -> None:
        experts = rng.permutation(model.routed)[:model.top_k]
        combine = StreamingCombine(n_tokens=1, d_model=hidden.shape[1], layer=0, tokens=np.zeros(model.top_k, np.int64),
                                   experts=experts, weights=np.full(model.top_k, 1 / model.top_k, np.float32),
                                   n_routed=model.routed)
        await run_forward(combine, hidden, np.zeros(model.top_k, np.int64),
                          lambda t, la, e, x: plan_pairs(t, la, e, index, exclude=x), executor, book, limits)
        combine.finish(allow_partial=False)

    async def run() -> Timing:
        wall, cpu = [], []
        for i in range(repeat + repeat // 10):  # the first tenth warms up
            t0, c0 = time.perf_counter(), time.process_time()
            await one()
            if i >= repeat // 10:
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
        return Timing(float(np.median(wall)), min(wall), float(np.median(cpu)))

    return asyncio.run(run())


def decode_dispatch() -> list[dict[str, Any]]:
    """A decode layer's plan, dispatch and combine on the router, each holder called per batch and per
    request, against the per-layer budget of network and dispatch."""
    model = QWEN3_30B
    view = view_of(model, seed=1)
    indexes = {f"{n} holder{'s' if n > 1 else ''}, {model.routed} experts (bench/generate.py)": ShardIndex.build(
        MODEL, [provider(h) for h in range(n)], [holding(e % n, 0, e, tps=1000) for e in range(model.routed)], POLICY)
        for n in (1, 4)}
    indexes[f"whole model, {N_PROVIDERS} providers"] = ShardIndex.build(MODEL, view.providers, view.holdings, POLICY)
    rows, table = [], []
    for name, index in indexes.items():
        per_batch = _time_forwards(index, model, InstantHolders(gather=False), 2000)
        per_request = _time_forwards(index, model, InstantHolders(gather=True), 2000)
        ratio = per_request.median_s / per_batch.median_s
        share = per_request.median_s / DECODE_LAYER_BUDGET_S
        rows.append({"index": name, "per_batch": per_batch.to_dict(), "per_request": per_request.to_dict(),
                     "ratio": ratio, "budget_ms": DECODE_LAYER_BUDGET_S * 1e3, "share": share})
        table.append([name, f"1x{model.top_k}", f"{per_batch.median_s * 1e6:.0f} [{per_batch.best_s * 1e6:.0f}]",
                      f"{per_request.median_s * 1e6:.0f} [{per_request.best_s * 1e6:.0f}] cpu "
                      f"{per_request.cpu_s * 1e6:.0f}", f"{ratio:.2f}x", f"{share:.1%}"])
    print_table(f"A decode layer's plan + dispatch + combine on the router, {model.name}, holders answering at once "
                f"(µs); a request per holder against a request per batch, and its share of the "
                f"{DECODE_LAYER_BUDGET_S * 1e3:.0f} ms budget",
                ["index", "tokens x k", "a request per batch [best]", "a request per holder [best] cpu",
                 "per holder / per batch", "share of budget"], table)
    return rows


def shard_map_whole_model() -> list[dict[str, Any]]:
    model = KIMI_K3
    view = view_of(model, seed=3)
    took, result = timed(lambda: shard_map(MODEL, view.providers, view.holdings, POLICY), 3)
    row = {"model": model.name, "layers": model.layers, "experts_per_layer": model.routed + model.shared,
           "holdings": len(view.holdings), "covered_experts": result["covered_experts"], **took.to_dict(),
           "target_ms": SHARD_MAP_TARGET_S * 1e3, "ratio": took.median_s / SHARD_MAP_TARGET_S}
    print_table(f"Shard map of a whole model, {N_PROVIDERS} providers, {REPLICAS} replicas per expert (ms)",
                ["model", "layers x experts", "holdings", "covered", "ms [best] cpu", "target", "ratio", "met"],
                [[model.name, f"{model.layers}x{model.routed + model.shared}", row["holdings"],
                  row["covered_experts"], took.cell(), row["target_ms"], row["ratio"], row["ratio"] <= 1]])
    return [row]


def record_verification() -> list[dict[str, Any]]:
    """One signed provider record with 500 holdings: verify (signature, then parse and check every
    field) beside a bare ed25519 verify of a 64-byte message and of the record's own bytes."""
    key = new_key(1)
    signed = signed_record(key, holdings=record_holdings(500))
    envelope = signed.envelope()
    message = RECORD_DOMAIN + signed.text.encode("ascii")
    signature = bytes.fromhex(signed.signature)
    verify_key = VerifyKey(key.verify_key.encode())
    short = key.sign(b"x" * 64)
    full, _ = timed(lambda: verify_record(envelope, max_bytes=1 << 20), 200)
    bare_short, _ = timed(lambda: verify_key.verify(short.message, short.signature), 200)
    bare_record, _ = timed(lambda: verify_key.verify(message, signature), 200)
    row = {"holdings": 500, "record_bytes": len(signed.text), "verify_record": full.to_dict(),
           "ed25519_64_bytes": bare_short.to_dict(), "ed25519_record_bytes": bare_record.to_dict(),
           "ratio_to_bare_64": full.median_s / bare_short.median_s,
           "ratio_to_bare_record": full.median_s / bare_record.median_s}
    print_table("Provider record verification, 500 holdings (ms), beside a bare ed25519 verify",
                ["holdings", "record bytes", "verify_record [best] cpu", "ed25519 64 B", "ed25519 record bytes",
                 "x bare 64 B", "x bare record"],
                [[500, row["record_bytes"], full.cell(), bare_short.median_s * 1e3, bare_record.median_s * 1e3,
                  f"{row['ratio_to_bare_64']:.1f}x", f"{row['ratio_to_bare_record']:.1f}x"]])
    return [row]


# One entry per table: (name in the JSON results, function that prints it and returns its rows).
TABLES: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = [
    ("planning", planning),
    ("decode_planning", decode_planning),
    ("decode_dispatch", decode_dispatch),
    ("shard_map", shard_map_whole_model),
    ("record_verification", record_verification),
]


def main() -> None:
    results = {name: table() for name, table in TABLES}
    write_results("planner", {"tables": results}, [
        *(headline(f"dispatch plan, one layer, {r['model']}, {r['pairs']} pairs (arrays)", r["arrays"]["median_ms"],
                   "ms",
                   reference="plan_dispatch, JSON in and out", reference_value=r["json"]["median_ms"],
                   target=f"≤ {r['target_ms']:.0f} ms") for r in results["planning"]),
        *(headline(f"decode step's plan, one layer, {r['model']}, {r['tokens']} token(s)", r["median_ms"], "ms",
                   reference="a decode layer's network + dispatch budget", reference_value=r["budget_ms"],
                   target=f"≤ {DECODE_PLAN_SHARE:.0%} of it") for r in results["decode_planning"]),
        *(headline(f"decode layer's plan + dispatch + combine, {r['index']}", r["per_request"]["median_ms"], "ms",
                   reference="the same, a request per batch", reference_value=r["per_batch"]["median_ms"])
          for r in results["decode_dispatch"]),
        *(headline(f"shard map of a whole model, {r['model']}", r["median_ms"], "ms",
                   target=f"≤ {r['target_ms']:.0f} ms") for r in results["shard_map"])])


if __name__ == "__main__":
    main()
