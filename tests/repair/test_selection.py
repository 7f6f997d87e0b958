"""Repair selection (pure): the hash rule against a plain-Python reference, slot exclusivity, stability, drops, admit.

No database: every view is built in memory from a seeded generator.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.repair.selection import (
    ADD,
    DROP,
    NO_BLOB_URI,
    NO_CANDIDATE,
    ExpertView,
    RepairRow,
    RepairRules,
    _top_order,
    admit,
    key64,
    rendezvous_order,
    replication_target,
    select_repairs,
)

MODEL = "kimi-k3"
RULES = RepairRules(min_replication=2, max_replication=8, hot_threshold_tps=1000.0, headroom=2.0)
BLOB = "tenzro://blob/" + "ab" * 32
MASK = (1 << 64) - 1


# --- the rule as docs/protocol.md states it, in plain Python integers ---------------------------------------------

def ref_key64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def ref_splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def ref_order(model_id: str, layer: int, expert: int, providers) -> list[str]:
    e = ref_key64(f"{model_id}/{layer}/{expert}")
    return sorted(set(providers), key=lambda p: (-ref_splitmix64(e ^ ref_key64(p)), p))


def ref_target(demand: float, capacity: float, rules: RepairRules) -> int:
    if demand < rules.hot_threshold_tps:
        return rules.min_replication
    per_holder = capacity if capacity > 0 else rules.hot_threshold_tps
    if per_holder <= 0:
        return rules.max_replication
    return max(rules.min_replication, min(rules.max_replication, math.ceil(demand * rules.headroom / per_holder)))


def ref_select(model_id, experts, candidates, rules) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """(rows as tuples, unrepairable, capped) computed expert by expert, the slow obvious way."""
    rows, unrepairable, capped = [], [], []
    for v in experts:
        target = ref_target(v.committed_tps, v.capacity_tps, rules)
        keep = ref_target(2 * v.committed_tps, v.capacity_tps, rules)
        held = len(v.holders)
        if held < target:
            if v.blob_uri is None:
                unrepairable.append((v.layer, v.expert, NO_BLOB_URI))
                continue
            order = [p for p in ref_order(model_id, v.layer, v.expert, candidates) if p not in v.holders]
            if len(order) < target - held:
                if held + len(order) >= rules.min_replication:
                    capped.append((v.layer, v.expert, target, held + len(order)))
                elif not order:
                    unrepairable.append((v.layer, v.expert, NO_CANDIDATE))
            for rank, p in enumerate(order[:target - held]):
                rows.append((v.layer, v.expert, p, ADD, rank, v.blob_uri, held, target))
        elif held > keep:
            order = ref_order(model_id, v.layer, v.expert, v.holders)
            for rank in range(keep, held):
                rows.append((v.layer, v.expert, order[rank], DROP, rank, v.blob_uri, held, keep))
    rows.sort(key=lambda r: (r[0], r[1], r[3], r[4]))
    return rows, sorted(unrepairable), sorted(capped)


def as_tuple(row: RepairRow) -> tuple:
    return (row.layer, row.expert, row.provider, row.action, row.rank, row.blob_uri, row.holders, row.target)


def random_view(rng: np.random.Generator, *, providers: list[str], layers: int = 3, experts: int = 40,
                hot: float = 0.1, no_blob: float = 0.1) -> list[ExpertView]:
    """Holder counts from 0 to 11 (under, fine and over max_replication), some hot, some inline-only."""
    views = []
    for layer, expert in itertools.product(range(layers), range(experts)):
        held = int(rng.choice([0, 1, 1, 1, 2, 3, 5, 7, 8, 9, 10, 11]))
        holders = tuple(providers[i] for i in rng.choice(len(providers), size=held, replace=False))
        blob = None if (held == 0 or rng.random() < no_blob) else BLOB
        tps = float(rng.choice([1000.0, 1500.0, 4000.0, 20000.0])) if rng.random() < hot else 10.0 * held
        views.append(ExpertView(layer, expert, holders, blob, tps, float(rng.choice([0.0, 250.0, 1000.0, 5000.0]))))
    return views


def provider_ids(n: int, prefix: str = "p") -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]


# --- the hash -------------------------------------------------------------------------------------------------------

def test_known_answer() -> None:
    """The vector docs/protocol.md prints: another implementation checks itself against it."""
    assert key64("kimi-k3/0/7") == 0x883D24A4D71192A6
    assert key64("a") == 0x2F42665B399EF840
    assert ref_splitmix64(0x883D24A4D71192A6 ^ 0x2F42665B399EF840) == 0xCE191482F2E2C5C1
    assert rendezvous_order("kimi-k3", 0, 7, ["c", "b", "a", "d", "a"]) == ["a", "d", "b", "c"]


@pytest.mark.parametrize("seed", range(5))
def test_rendezvous_order_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    providers = provider_ids(int(rng.integers(1, 60)), prefix=f"s{seed}-")
    layer, expert = int(rng.integers(0, 61)), int(rng.integers(0, 898))
    assert rendezvous_order(MODEL, layer, expert, providers) == ref_order(MODEL, layer, expert, providers)


def test_top_order_is_exact_with_ties_and_zeros() -> None:
    """argmax rounds zero each winner; scores that really are 0 or tie must still follow (score desc, column asc)."""
    rng = np.random.default_rng(7)
    scores = rng.integers(0, 4, size=(500, 12)).astype(np.uint64)  # many ties, many zeros
    scores[:50] = 0
    for k in (1, 2, 3, 8, 12, 20):
        expected = [sorted(range(12), key=lambda c, row=row: (-int(row[c]), c))[:k] for row in scores]
        assert _top_order(scores.copy(), k).tolist() == expected


# --- selection ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    providers = provider_ids(30, prefix=f"m{seed}-")
    views = random_view(rng, providers=providers)
    candidates = providers[: int(rng.integers(5, 31))]
    got = select_repairs(MODEL, views, candidates, RULES)
    rows, unrepairable, capped = ref_select(MODEL, views, candidates, RULES)
    assert [as_tuple(r) for r in got.rows] == rows
    assert (got.unrepairable, got.capped) == (unrepairable, capped)
    assert got.considered == sum(
        len(v.holders) < ref_target(v.committed_tps, v.capacity_tps, RULES)
        or len(v.holders) > ref_target(2 * v.committed_tps, v.capacity_tps, RULES) for v in views)


@pytest.mark.parametrize("seed", range(6))
def test_two_nodes_sharing_a_view_never_get_the_same_slot(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    providers = provider_ids(40, prefix=f"x{seed}-")
    views = random_view(rng, providers=providers, experts=60)
    candidates = providers[:25]
    full = select_repairs(MODEL, views, candidates, RULES)
    adds = defaultdict(list)
    for row in full.rows:
        if row.action == ADD:
            adds[row.layer, row.expert].append(row.provider)
    assert adds, "the random view should need repairs"
    for v in views:
        named = adds.get((v.layer, v.expert), [])
        assert len(named) == len(set(named)), "two rows for one provider"
        assert not set(named) & set(v.holders), "a holder asked to fetch what it holds"
        target = ref_target(v.committed_tps, v.capacity_tps, RULES)
        available = len(set(candidates) - set(v.holders))
        expected = 0 if (v.blob_uri is None or len(v.holders) >= target) else min(target - len(v.holders), available)
        assert len(named) == expected, (v, named)
    # What each node acts on is exactly its share of the rows everyone computes, and the shares are disjoint.
    for provider in candidates + providers[25:30] + ["not-a-member"]:
        mine = select_repairs(MODEL, views, candidates, RULES, only=provider)
        assert mine.rows == [r for r in full.rows if r.provider == provider]
        assert (mine.unrepairable, mine.considered) == (full.unrepairable, full.considered)


def test_same_rows_whatever_the_input_order() -> None:
    rng = np.random.default_rng(3)
    providers = provider_ids(30)
    views = random_view(rng, providers=providers)
    base = select_repairs(MODEL, views, providers, RULES)
    shuffled = [ExpertView(v.layer, v.expert, tuple(rng.permutation(list(v.holders))) if v.holders else (),
                           v.blob_uri, v.committed_tps, v.capacity_tps) for v in rng.permutation(views)]
    again = select_repairs(MODEL, shuffled, list(rng.permutation(providers)) + providers[:5], RULES)
    assert again == base


def test_stable_when_unrelated_providers_join() -> None:
    """HRW: a newcomer takes a slot only where it out-ranks the chosen providers (about its share of slots)."""
    rng = np.random.default_rng(11)
    old = provider_ids(200, prefix="old")
    new = provider_ids(20, prefix="new")  # +10% candidates: expected share of the new order, 20/220
    views = [ExpertView(layer, expert, tuple(old[i] for i in rng.choice(200, size=1, replace=False)), BLOB,
                        1500.0 if expert % 10 == 0 else 0.0)
             for layer, expert in itertools.product(range(8), range(100))]
    before = select_repairs(MODEL, views, old, RULES)
    after = select_repairs(MODEL, views, old + new, RULES)
    key = {(r.layer, r.expert, r.provider) for r in before.rows}
    key_after = {(r.layer, r.expert, r.provider) for r in after.rows}
    moved = len(key - key_after) / len(key)
    taken_by_new = sum(r.provider in new for r in after.rows) / len(after.rows)
    print(f"\nrows {len(before.rows)}: moved {moved:.3f}, taken by newcomers {taken_by_new:.3f} (share 0.091)")
    assert 0 < moved <= 2 * 20 / 220
    assert taken_by_new == pytest.approx(moved * len(key) / len(after.rows))  # every moved slot went to a newcomer
    # Experts where no newcomer won keep exactly their rows, ranks included.
    by_expert = defaultdict(list)
    for r in after.rows:
        by_expert[r.layer, r.expert].append(r)
    for (layer, expert), rows in by_expert.items():
        if not any(r.provider in new for r in rows):
            assert rows == [r for r in before.rows if (r.layer, r.expert) == (layer, expert)]


def test_hot_experts_raise_by_demand_and_nothing_above() -> None:
    providers = provider_ids(20)
    views = [
        ExpertView(0, 0, tuple(providers[:3]), BLOB, 1000.0, 250.0),  # hot (inclusive): ceil(1000*2/250) = 8
        ExpertView(0, 1, tuple(providers[:8]), BLOB, 50000.0, 250.0),  # hot, 400 wanted, capped at max: nothing
        ExpertView(0, 2, tuple(providers[:5]), BLOB, 999.0, 1.0),  # not hot, above min: nothing
        ExpertView(0, 3, tuple(providers[:1]), BLOB, 0.0),  # cold, once: 1 -> 2
        ExpertView(0, 4, tuple(providers[:2]), BLOB, 1500.0, 1000.0),  # hot: ceil(1500*2/1000) = 3
    ]
    sel = select_repairs(MODEL, views, providers, RULES)
    adds = defaultdict(list)
    for r in sel.rows:
        assert r.action == ADD
        adds[r.expert].append(r)
    assert sorted(adds) == [0, 3, 4]
    assert [r.rank for r in adds[0]] == list(range(5)) and {r.target for r in adds[0]} == {8}
    assert [r.provider for r in adds[0]] == [p for p in rendezvous_order(MODEL, 0, 0, providers)
                                             if p not in providers[:3]][:5]
    assert len(adds[3]) == 1 and adds[3][0].target == 2 and adds[3][0].holders == 1
    assert [(r.target, r.holders) for r in adds[4]] == [(3, 2)]
    assert sel.considered == 3


@pytest.mark.parametrize(("demand", "capacity", "target"), [
    (0.0, 0.0, 2), (999.9, 1.0, 2),  # not hot: min_replication whatever the capacity
    (1000.0, 1000.0, 2), (1000.0, 500.0, 4), (1000.0, 400.0, 5), (3000.0, 1000.0, 6),
    (1000.0, 0.0, 2), (2600.0, 0.0, 6),  # unmeasured capacity: the threshold stands in for it
    (10**6, 1.0, 8), (10**6, 10**9, 2),  # clamped to [min, max]
])
def test_replication_target_follows_demand(demand: float, capacity: float, target: int) -> None:
    assert replication_target(demand, capacity, RULES) == target


@given(demand=st.floats(0, 1e7), more=st.floats(0, 1e7), capacity=st.floats(0, 1e6))
def test_replication_target_is_monotone_and_bounded(demand: float, more: float, capacity: float) -> None:
    low, high = replication_target(demand, capacity, RULES), replication_target(demand + more, capacity, RULES)
    assert RULES.min_replication <= low <= high <= RULES.max_replication


def test_threshold_zero_and_no_capacity_means_the_cap() -> None:
    rules = RepairRules(min_replication=1, max_replication=3, hot_threshold_tps=0.0, headroom=1.0)
    assert replication_target(0.0, 0.0, rules) == 3


def test_drops_wait_until_demand_halves() -> None:
    """A copy added for demand is kept while demand stays above half of what asked for it (no flapping)."""
    providers = provider_ids(10)
    held = tuple(providers[:4])  # raised to 4 at demand 2000 (capacity 1000, headroom 2)
    assert replication_target(2000.0, 1000.0, RULES) == 4
    for demand, drops in [(2000.0, 0), (1600.0, 0), (1000.0, 0), (999.0, 0), (499.0, 2), (0.0, 2)]:
        sel = select_repairs(MODEL, [ExpertView(0, 0, held, BLOB, demand, 1000.0)], providers, RULES)
        assert sum(r.action == DROP for r in sel.rows) == drops, demand
        assert all(r.target == 2 for r in sel.rows if r.action == DROP)


def test_over_replicated_drops_the_lowest_ranked_holders() -> None:
    providers = provider_ids(20)
    holders = tuple(providers[:11])
    sel = select_repairs(MODEL, [ExpertView(2, 5, holders, BLOB, 9999.0)], providers, RULES)
    order = rendezvous_order(MODEL, 2, 5, holders)
    assert [(r.action, r.provider, r.rank, r.holders, r.target) for r in sel.rows] == \
        [(DROP, order[rank], rank, 11, 8) for rank in (8, 9, 10)]
    # Drops rank over the holders only: candidates that do not hold it change nothing.
    assert select_repairs(MODEL, [ExpertView(2, 5, holders, BLOB, 9999.0)], providers[:11], RULES).rows == sel.rows
    # With no demand it keeps min_replication: every holder but the best two is dropped.
    idle = select_repairs(MODEL, [ExpertView(2, 5, holders, BLOB)], providers, RULES)
    assert [r.provider for r in idle.rows] == order[2:]
    mine = select_repairs(MODEL, [ExpertView(2, 5, holders, BLOB)], providers, RULES, only=order[0])
    assert mine.rows == [] and mine.considered == 1


def test_skewed_views_never_drop_the_best_max_replication_holders() -> None:
    """A view that misses some holders can only drop holders outside the top max_replication of the real order."""
    rng = np.random.default_rng(5)
    providers = provider_ids(30)
    for expert in range(200):
        real = tuple(providers[i] for i in rng.choice(30, size=int(rng.integers(9, 16)), replace=False))
        keep = set(rendezvous_order(MODEL, 0, expert, real)[:RULES.max_replication])
        seen = tuple(h for h in real if rng.random() < 0.85)
        sel = select_repairs(MODEL, [ExpertView(0, expert, seen, BLOB, 50000.0)], providers, RULES)
        dropped = {r.provider for r in sel.rows if r.action == DROP}
        assert not dropped & keep
        assert len(seen) - len(dropped) == min(len(seen), RULES.max_replication)


def test_unrepairable_reasons_and_capped() -> None:
    providers = provider_ids(3)
    views = [
        ExpertView(0, 0, (), None),  # held by nobody
        ExpertView(0, 1, (providers[0],), None),  # held once, inline payload only
        ExpertView(1, 0, (providers[0],), BLOB),  # fine: providers[1] or [2] fetches it
        ExpertView(1, 1, tuple(providers), BLOB, 2000.0),  # hot, wants 4: every candidate already holds it
        ExpertView(1, 2, (providers[0],), BLOB, 8000.0, 1000.0),  # hot, wants 8: both others fetch it
    ]
    sel = select_repairs(MODEL, views, providers, RULES)
    assert sel.unrepairable == [(0, 0, NO_BLOB_URI), (0, 1, NO_BLOB_URI)]
    assert sel.capped == [(1, 1, 4, 3), (1, 2, 8, 3)]  # (layer, expert, target, reachable)
    assert [(r.layer, r.expert) for r in sel.rows] == [(1, 0), (1, 2), (1, 2)]
    assert sel.considered == 5
    lonely = select_repairs(MODEL, views[2:3], [], RULES)  # no candidate list at all
    assert (lonely.rows, lonely.unrepairable, lonely.considered) == ([], [(1, 0, NO_CANDIDATE)], 1)
    empty = select_repairs(MODEL, [], providers, RULES)
    assert (empty.rows, empty.unrepairable, empty.considered) == ([], [], 0)


def test_inconsistent_rules_are_refused() -> None:
    with pytest.raises(ValueError):
        select_repairs(MODEL, [], [], RepairRules(min_replication=3, max_replication=2, hot_threshold_tps=1.0,
                                                  headroom=2.0))
    with pytest.raises(ValueError):
        select_repairs(MODEL, [], [], RepairRules(min_replication=1, max_replication=2, hot_threshold_tps=1.0,
                                                  headroom=0.5))


# --- admit ----------------------------------------------------------------------------------------------------------

def row(layer: int, expert: int, holders: int, action: str = ADD, provider: str = "me") -> RepairRow:
    return RepairRow(layer, expert, provider, action, 0, BLOB, holders, 2)


def test_admit_takes_the_most_under_replicated_first() -> None:
    rows = [row(0, 3, 1), row(0, 1, 4), row(1, 0, 0), row(0, 2, 1), row(0, 9, 12, DROP), row(0, 0, 1)]
    admitted, deferred = admit(rows, 2)
    assert admitted == [row(1, 0, 0), row(0, 0, 1), row(0, 9, 12, DROP)]
    assert deferred == [row(0, 2, 1), row(0, 3, 1), row(0, 1, 4)]
    assert admit(rows, 0) == ([row(0, 9, 12, DROP)], [row(1, 0, 0), row(0, 0, 1), *deferred])
    assert admit([], 2) == ([], [])


def test_admit_refuses_misuse() -> None:
    with pytest.raises(ValueError):
        admit([row(0, 0, 1)], -1)
    with pytest.raises(ValueError):
        admit([row(0, 0, 1), row(0, 1, 1, provider="someone-else")], 2)
