"""Repair passes of a whole network, in memory: skewed views, churn, at most two admissions per pass.

The model: 100 nodes, one model of 4 layers x 64 experts, policy min 2 / max 8 / hot 1000 tps / headroom 2,
at most 2 experts admitted per pass, every holder's capacity 500 rows/s. Initially many experts are held
once, some by nobody, and ~5% only as inline payloads (no blob: unrepairable). ~5% are hot, with a demand
drawn from 1000, 1500, 2000 and 4000 rows/s (targets 4, 6, 8 and 8: ceil(demand x 2 / 500), capped at 8);
the rest see 10 rows/s (target 2). An expert's demand is spread evenly over its holders, each advertising
its share as committed_tps, so a view that misses holders also under-counts the demand.

A round is one repair pass on every node, all computed from the state at the start of the round:
  1. churn (rounds before CHURN_ROUNDS): 10 random nodes leave and their holdings vanish; 10 new nodes
     join. A joiner takes part in the model as docs/specification.md ("Repair") says a node does, by holding one of its
     experts: its operator loads one random expert that some provider announces a blob for (so it is a
     candidate in other nodes' views from this round on, and runs its own passes).
  2. every node that holds something of the model sees itself plus a fresh random 80-95% of the other
     providers (membership skew, re-drawn each round), builds the ExpertViews from what those announce,
     runs select_repairs(only=itself), admits at most 2 adds, and acts on a drop only if the same drop
     row was in its previous pass too (the caller's two-stable-passes gate).
  3. at the end of the round every admitted add is announced (a holding with a blob), every gated drop
     is gone.

Phases: CHURN_ROUNDS passes with churn and skewed views, QUIET_ROUNDS passes without churn (views still
skewed), then CONVERGED_ROUNDS passes where every node sees every provider (views have converged).

Convergence criterion: at the end of the quiet passes every repairable expert (one that some current
holder announces a blob for) holds at least min_replication; once views converge every one holds its
demand's target, and none holds more than the keep of its demand (the target at twice the demand).
During churn an expert whose holders just left can be below target through no fault of
the repair, so that is measured (printed per round) but not asserted; an expert all of whose holders
leave in one round is lost (no longer repairable), which is why the repairable count falls during churn
— unless the network has source nodes: nodes whose prepare jobs published the model (they keep the
checkpoint and never leave here). Each source's pass recovers, up to the per-pass limit (beside its
adds), the experts its view shows no blob of (no holder, or inline copies only) two passes running
(apps/repair/recovery.py), and then no expert is lost at all
(test_no_expert_is_lost_to_churn_while_its_source_is_reachable prints how many are lost with and
without them).

Over-replication: skewed views under-count holders, so a hot expert keeps gaining an extra copy now
and then while the views stay skewed (the drop gate needs the same drop row in two consecutive passes,
which two different skewed views rarely both show). It stays within OVER_BOUND above max_replication,
and once views converge the drops go through and nothing stays above its keep. The test prints
replication against demand at the end.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from apps.repair.recovery_order import recovery_order
from apps.repair.selection import (
    ADD,
    DROP,
    DROP_HYSTERESIS,
    ExpertView,
    RepairRules,
    admit,
    replication_target,
    select_repairs,
)

MODEL = "sim-model"
RULES = RepairRules(min_replication=2, max_replication=8, hot_threshold_tps=1000.0, headroom=2.0)
CAPACITY = 500.0  # every holder's capacity_tps
HOT_DEMANDS = (1000.0, 1500.0, 2000.0, 4000.0)
COLD_DEMAND = 10.0
PER_PASS = 2  # policy repair_max_experts_per_pass
LAYERS, EXPERTS = 4, 64
NODES, CHURN = 100, 10
CHURN_ROUNDS, QUIET_ROUNDS, CONVERGED_ROUNDS = 20, 6, 4  # 30 passes in all
OVER_BOUND = 4  # replicas above max_replication the skewed phases may reach (measured: see the test's print)
BLOB = "tenzro://blob/"

Expert = tuple[int, int]


@dataclass
class Network:
    rng: np.random.Generator
    hot: dict[Expert, float]  # hot expert -> its demand in rows/s (the others: COLD_DEMAND)
    holdings: dict[str, dict[Expert, bool]] = field(default_factory=dict)  # node -> {expert: announces a blob}
    last_drops: dict[str, set[Expert]] = field(default_factory=dict)  # node -> drop rows of its previous pass
    joined: int = 0
    # Nodes whose prepare jobs published every expert of the model (they keep the checkpoint): they
    # never leave, and each pass recovers the experts nobody holds (apps/repair/recovery.py).
    sources: set[str] = field(default_factory=set)
    last_lost: dict[str, set[Expert]] = field(default_factory=dict)  # source -> experts its previous pass found lost
    recovered: int = 0

    def new_node(self) -> str:
        self.joined += 1
        return f"node-{self.joined:05d}"

    def holders(self) -> dict[Expert, list[str]]:
        out: dict[Expert, list[str]] = defaultdict(list)
        for node, held in self.holdings.items():
            for expert in held:
                out[expert].append(node)
        return out

    def demand(self, expert: Expert) -> float:
        return self.hot.get(expert, COLD_DEMAND)

    def target(self, expert: Expert) -> int:
        return replication_target(self.demand(expert), CAPACITY, RULES)

    def keep(self, expert: Expert) -> int:
        return replication_target(DROP_HYSTERESIS * self.demand(expert), CAPACITY, RULES)

    def repairable(self) -> set[Expert]:
        return {e for held in self.holdings.values() for e, blob in held.items() if blob}

    def churn(self) -> None:
        nodes = sorted(set(self.holdings) - self.sources)
        for node in self.rng.choice(nodes, size=CHURN, replace=False):
            del self.holdings[node]
            self.last_drops.pop(node, None)
        repairable = sorted(self.repairable())
        for _ in range(CHURN):
            # A joiner takes part by holding one expert of the model that it can fetch (module docstring).
            expert = repairable[int(self.rng.integers(len(repairable)))]
            self.holdings[self.new_node()] = {expert: True}

    def view_of(self, node: str, holders: dict[Expert, list[str]], skewed: bool) -> tuple[list[ExpertView], list[str]]:
        others = [n for n in sorted(self.holdings) if n != node]
        seen = round(len(others) * self.rng.uniform(0.80, 0.95)) if skewed else len(others)
        visible = set(self.rng.choice(others, size=seen, replace=False).tolist()) | {node}
        views = []
        for layer in range(LAYERS):
            for expert in range(EXPERTS):
                every = holders.get((layer, expert), ())
                mine = [h for h in every if h in visible]
                blob = BLOB if any(self.holdings[h][layer, expert] for h in mine) else None
                share = self.demand((layer, expert)) / len(every) if every else 0.0  # each holder's committed_tps
                views.append(ExpertView(layer, expert, tuple(mine), blob, share * len(mine), CAPACITY if mine else 0.0))
        candidates = [n for n in visible if self.holdings[n]]
        return views, candidates

    def round(self, skewed: bool) -> dict[str, int]:
        holders = self.holders()
        adds: list[tuple[str, Expert]] = []
        drops: list[tuple[str, Expert]] = []
        admitted_most = 0
        for node in sorted(self.holdings):
            if not self.holdings[node] and node not in self.sources:
                continue  # holds nothing of the model: no pass for it
            views, candidates = self.view_of(node, holders, skewed)
            selection = select_repairs(MODEL, views, candidates, RULES, only=node)
            admitted, _ = admit(selection.rows, PER_PASS)
            mine = [(r.layer, r.expert) for r in admitted if r.action == ADD]
            admitted_most = max(admitted_most, len(mine))
            assert len(mine) <= PER_PASS
            if node in self.sources:  # lost two passes running: published again, up to the per-pass limit
                lost = {(v.layer, v.expert) for v in views if v.blob_uri is None}  # no blob to fetch it from
                again = recovery_order(MODEL, node, lost & self.last_lost.get(node, set()))[:PER_PASS]
                self.last_lost[node] = lost
                self.recovered += len(again)
                mine += again
            adds += [(node, e) for e in mine]
            drop_rows = {(r.layer, r.expert) for r in admitted if r.action == DROP}
            drops += [(node, e) for e in drop_rows & self.last_drops.get(node, set())]
            self.last_drops[node] = drop_rows
        for node, expert in adds:
            self.holdings[node][expert] = True
        for node, expert in drops:
            self.holdings[node].pop(expert, None)
        return {"adds": len(adds), "drops": len(drops), "admitted_most": admitted_most,
                "same_slot_twice": sum(c > 1 for c in Counter(e for _, e in adds).values())}


def initial_network(seed: int, *, sources: int = 0) -> Network:
    rng = np.random.default_rng(seed)
    experts = [(layer, expert) for layer in range(LAYERS) for expert in range(EXPERTS)]
    hot = {e: float(rng.choice(HOT_DEMANDS)) for e in experts if rng.random() < 0.05}
    net = Network(rng=rng, hot=hot)
    nodes = [net.new_node() for _ in range(NODES)]
    net.sources = set(nodes[:sources])
    net.holdings = {n: {} for n in nodes}
    for expert in experts:
        count = int(rng.choice([0, 1, 2, 3], p=[0.05, 0.55, 0.25, 0.15]))
        inline_only = rng.random() < 0.05
        for n in rng.choice(nodes, size=count, replace=False):
            net.holdings[n][expert] = not inline_only and rng.random() < 0.9
    repairable = sorted(net.repairable())
    for n in nodes:  # every node takes part in the model (holds something of it)
        if not net.holdings[n]:
            net.holdings[n][repairable[int(rng.integers(len(repairable)))]] = True
    return net


def deficit(net: Network, *, floor_only: bool = False) -> tuple[int, int]:
    """(repairable experts below their demand's target, or below min_replication with `floor_only`,
    repairable experts) in the global state."""
    holders = net.holders()
    repairable = net.repairable()
    short = sum(len(holders[e]) < (RULES.min_replication if floor_only else net.target(e)) for e in repairable)
    return short, len(repairable)


def replication_by_demand(net: Network) -> dict[float, tuple[int, int, int]]:
    """{demand: (target, fewest holders, most holders)} over the repairable experts of that demand."""
    holders = net.holders()
    seen: dict[float, list[int]] = defaultdict(list)
    for e in net.repairable():
        seen[net.demand(e)].append(len(holders[e]))
    return {d: (replication_target(d, CAPACITY, RULES), min(c), max(c)) for d, c in sorted(seen.items())}


def run(seed: int, *, log: bool, sources: int = 0, converged_rounds: int = CONVERGED_ROUNDS) -> dict[str, object]:
    """Play the three phases; return what the assertions need. `sources`: nodes that prepared the
    model and recover what nobody holds (they never leave)."""
    net = initial_network(seed, sources=sources)
    at_start = net.repairable()
    short, repairable = deficit(net)
    if log:
        print(f"\nstart: {repairable} repairable of {LAYERS * EXPERTS} experts, {short} below target, "
              f"{len(net.hot)} hot")
    most_hot = most_cold = admitted_most = 0
    converged_in = None  # quiet passes after churn stopped until no repairable expert was below target
    for r in range(CHURN_ROUNDS + QUIET_ROUNDS + converged_rounds):
        phase = "churn" if r < CHURN_ROUNDS else "quiet" if r < CHURN_ROUNDS + QUIET_ROUNDS else "converged"
        if phase == "churn":
            net.churn()
        stats = net.round(skewed=phase != "converged")
        admitted_most = max(admitted_most, stats["admitted_most"])
        counts = Counter(e for held in net.holdings.values() for e in held)
        most_hot = max(most_hot, *(c for e, c in counts.items() if e in net.hot))
        most_cold = max(most_cold, *(c for e, c in counts.items() if e not in net.hot))
        short, repairable = deficit(net)
        if phase == "quiet" and converged_in is None and short == 0:
            converged_in = r - CHURN_ROUNDS + 1
        if log:
            print(f"round {r:2d} {phase:9s}: adds {stats['adds']:3d}, drops {stats['drops']}, same slot twice "
                  f"{stats['same_slot_twice']:2d}, most admitted {stats['admitted_most']}, below target "
                  f"{short}/{repairable}, max replicas {max(counts.values())}")
        if phase == "quiet" and r == CHURN_ROUNDS + QUIET_ROUNDS - 1:
            short_after_quiet, _ = deficit(net, floor_only=True)
    final = Counter(e for held in net.holdings.values() for e in held)
    by_demand = replication_by_demand(net)
    if log:
        print("replication against demand at the end (demand rows/s: target, fewest-most holders): " + ", ".join(
            f"{d:g}: {t}, {lo}-{hi}" for d, (t, lo, hi) in by_demand.items()))
    lost = len(at_start - net.repairable())  # repairable at the start, held by nobody with a blob at the end
    if log:
        print(f"experts lost to churn: {lost} of {len(at_start)} ({sources} source nodes; "
              f"{net.recovered} recoveries by them)")
    return {"lost": lost, "recovered": net.recovered,
            "admitted_most": admitted_most, "most_hot": most_hot, "most_cold": most_cold, "converged_in": converged_in,
            "short_after_quiet": short_after_quiet, "short_final": short, "final_max": max(final.values()),
            "above_keep": sum(c > net.keep(e) for e, c in final.items()), "by_demand": by_demand}


def test_network_heals_under_churn_and_skewed_views() -> None:
    started = time.perf_counter()
    result = run(seed=2024, log=True)
    print(f"max replication observed: {result['most_hot']} (hot experts, max_replication "
          f"{RULES.max_replication}), {result['most_cold']} (others, min_replication {RULES.min_replication}); "
          f"every repairable expert at target {result['converged_in']} quiet passes after churn stopped; "
          f"{time.perf_counter() - started:.1f} s")
    assert result["admitted_most"] <= PER_PASS
    assert result["short_after_quiet"] == 0, "repairable experts below min_replication after the quiet passes"
    assert result["most_hot"] <= RULES.max_replication + OVER_BOUND
    assert result["most_cold"] <= RULES.max_replication  # skew over-fills cold experts far less than max
    # Once views agree, the two-pass gate lets the drops through: nothing above its keep, nothing below target.
    assert result["final_max"] <= RULES.max_replication
    assert result["above_keep"] == 0
    assert result["short_final"] == 0
    # replication follows demand: each demand level sits at its target (clamped to max), not all at max
    for demand, (target, fewest, most) in result["by_demand"].items():
        assert target <= fewest and most <= replication_target(DROP_HYSTERESIS * demand, CAPACITY, RULES), demand
    assert {t for t, _, _ in result["by_demand"].values()} == {2, 4, 6, 8}


def test_bounds_hold_for_other_seeds() -> None:
    """The same assertions on a few more seeds (no log), so the bounds are not one lucky draw."""
    for seed in (1, 2):
        result = run(seed, log=False)
        assert result["admitted_most"] <= PER_PASS
        assert result["short_after_quiet"] == 0 and result["short_final"] == 0, (seed, result)
        assert result["above_keep"] == 0, (seed, result)
        assert result["most_hot"] <= RULES.max_replication + OVER_BOUND, (seed, result)
        assert result["final_max"] <= RULES.max_replication, (seed, result)


def test_no_expert_is_lost_to_churn_while_its_source_is_reachable() -> None:
    """Two nodes that prepared the model stay up: whatever churn takes, they publish again (after two
    passes seeing no holder), and the network converges as without churn. Without them, churn loses
    every expert whose holders all left in one round."""
    with_source = run(seed=2024, log=True, sources=2, converged_rounds=8)
    without = run(seed=2024, log=False)
    print(f"experts lost: {with_source['lost']} with the source reachable, {without['lost']} without it")
    assert with_source["lost"] == 0 and with_source["recovered"] > 0
    assert without["lost"] > 0  # what the last resort is for
    # the recovered experts start from one copy (some recovered only in the last quiet passes: the
    # sources also publish the experts nobody held at the start); a few passes after views converge,
    # all are at target
    assert with_source["short_final"] == 0, with_source
    assert with_source["above_keep"] == 0 and with_source["admitted_most"] <= PER_PASS
