"""Dispatch planner examples: the score, tiers, GPU bias, exclusion, splitting and load spreading."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.shardmap.gossip_view import ReplicationPolicy
from core.shardmap.index import ShardIndex
from core.shardmap.planner import MIN_BATCH_ROWS, plan_dispatch, plan_pairs
from testkit.shard_views import (
    MODEL,
    POLICY,
    holding,
    provider,
    provider_id,
    routings_json,
    routings_pairs,
    skewed_routings,
)

P = provider_id
NEVER_HOT = ReplicationPolicy(min_replication=2, max_replication=8, hot_threshold_tps=10**9)
ALWAYS_HOT = ReplicationPolicy(min_replication=2, max_replication=8, hot_threshold_tps=0)


def index(providers, holdings, policy=NEVER_HOT):
    return ShardIndex.build(MODEL, providers, holdings, policy)


def one_token(*experts, token=0):
    return [{"token_index": token, "experts": [{"layer": layer, "expert": e} for layer, e in experts]}]


def rows_per_provider(plan) -> Counter:
    load: Counter = Counter()
    for b in plan["batches"]:
        load[b["provider"]] += len(b["token_indices"])
    return load


def test_exact_shape():
    providers = [provider(1), provider(2)]
    shard = index(providers, [holding(1, 0, 3, tps=500), holding(2, 0, 3, tps=100), holding(2, 0, 4)])
    routings = [{"token_index": 5, "experts": [{"layer": 0, "expert": 4}, {"layer": 0, "expert": 3}]},
                {"token_index": 2, "experts": [{"layer": 0, "expert": 3}, {"layer": 1, "expert": 0}]},
                {"token_index": 9, "experts": []}]
    p1, p2 = providers
    assert plan_dispatch(routings, shard) == {
        "batches": [
            {"layer": 0, "expert": 3, "provider": P(1), "quic_endpoint": p1.quic_endpoint,
             "quic_cert_sha256": p1.quic_cert_sha256, "http_endpoint": p1.http_endpoint, "token_indices": [2, 5],
             "backups": [P(2)]},
            {"layer": 0, "expert": 4, "provider": P(2), "quic_endpoint": p2.quic_endpoint,
             "quic_cert_sha256": p2.quic_cert_sha256, "http_endpoint": p2.http_endpoint, "token_indices": [5],
             "backups": []},
        ],
        "token_assignments": [
            {"token_index": 2, "slots": [{"layer": 0, "expert": 3, "provider": P(1)}]},
            {"token_index": 5, "slots": [{"layer": 0, "expert": 4, "provider": P(2)},  # the token's own order
                                         {"layer": 0, "expert": 3, "provider": P(1)}]},
            {"token_index": 9, "slots": []},
        ],
        "unroutable": [{"token_index": 2, "layer": 1, "expert": 0, "reason": "no_holder"}],
    }


def test_empty_routings_plan_nothing():
    assert plan_dispatch([], index([], [])) == {"batches": [], "token_assignments": [], "unroutable": []}


@pytest.mark.parametrize(("a", "b", "winner"), [
    ({"tps": 1000}, {"tps": 100}, 1),  # more measured throughput
    ({"tps": 100, "latency_ms": 500.0}, {"tps": 100, "latency_ms": 5.0}, 2),  # same tps: lower latency
    ({"tps": 100}, {"tps": 100}, 1),  # a tie: the smaller provider id
    ({"tps": 0}, {"tps": 2, "latency_ms": 9.0}, 2),  # one that measured nothing counts as the slowest measured
])
def test_score_prefers_the_earliest_finish(a, b, winner):
    providers = [provider(1, latency_ms=a.get("latency_ms", 10.0)), provider(2, latency_ms=b.get("latency_ms", 10.0))]
    shard = index(providers, [holding(1, 0, 0, tps=a["tps"]), holding(2, 0, 0, tps=b["tps"])])
    assert plan_dispatch(one_token((0, 0)), shard)["batches"][0]["provider"] == P(winner)


def test_unmeasured_latency_counts_as_the_slowest_measured():
    # 1 token: finish = latency + 1/tps. Provider 2 is unmeasured (taken as 0.2 s, the slowest measured).
    providers = [provider(1, latency_ms=200.0), provider(2, latency_ms=None), provider(3, latency_ms=199.0)]
    holdings = [holding(1, 0, 0, tps=1000), holding(2, 0, 0, tps=1000)]
    assert plan_dispatch(one_token((0, 0)), index(providers, holdings))["batches"][0]["provider"] == P(1)
    holdings.append(holding(3, 0, 0, tps=1000))
    assert plan_dispatch(one_token((0, 0)), index(providers, holdings))["batches"][0]["provider"] == P(3)


def test_an_unmeasured_holder_is_planned_like_the_slowest_measured_not_shut_out():
    # A holder back from a restart advertises capacity 0 until it has been sent rows: ranked as the
    # slowest measured holder (100 rows/s here), it shares the rows of a large batch with it.
    providers = [provider(1), provider(2), provider(3)]
    shard = index(providers, [holding(1, 0, 0, tps=1000), holding(2, 0, 0, tps=100), holding(3, 0, 0, tps=0)])
    assert plan_dispatch(one_token((0, 0)), shard)["batches"][0]["provider"] == P(1)
    load = rows_per_provider(plan_dispatch(routings_json(np.zeros((480, 1), np.int64)), shard, min_batch_rows=1))
    assert load[P(3)] == load[P(2)] > 0 and load[P(1)] > 8 * load[P(3)], load
    # nobody measured: every holder counts the same, and the rows are shared evenly
    shard = index(providers[:2], [holding(1, 0, 0, tps=0), holding(2, 0, 0, tps=0)])
    load = rows_per_provider(plan_dispatch(routings_json(np.zeros((64, 1), np.int64)), shard, min_batch_rows=1))
    assert load == {P(1): 32, P(2): 32}, load


def test_warm_beats_a_faster_cold_holder_and_cold_needs_allow_cold():
    providers = [provider(1), provider(2)]
    shard = index(providers, [holding(1, 0, 0, tps=10), holding(2, 0, 0, warm=False, tps=10_000),
                              holding(2, 0, 1, warm=False)])
    plan = plan_dispatch(one_token((0, 0), (0, 1)), shard)
    assert [(b["expert"], b["provider"], b["backups"]) for b in plan["batches"]] == [(0, P(1), [])]
    assert plan["unroutable"] == [{"token_index": 0, "layer": 0, "expert": 1, "reason": "only_cold_holders"}]
    plan = plan_dispatch(one_token((0, 0), (0, 1)), shard, allow_cold=True)
    assert [(b["expert"], b["provider"], b["backups"]) for b in plan["batches"]] == [(0, P(1), [P(2)]), (1, P(2), [])]
    assert plan["unroutable"] == []


def test_exclude_replans_around_failed_holders():
    providers = [provider(1), provider(2), provider(3)]
    shard = index(providers, [holding(1, 0, 0, tps=900), holding(2, 0, 0, tps=500), holding(3, 0, 0, warm=False),
                              holding(1, 0, 1)])
    plan = plan_dispatch(one_token((0, 0), (0, 1)), shard, exclude={P(1), "not-a-provider"}, allow_cold=True)
    assert [(b["expert"], b["provider"], b["backups"]) for b in plan["batches"]] == [(0, P(2), [P(3)])]
    assert plan["unroutable"] == [{"token_index": 0, "layer": 0, "expert": 1, "reason": "holders_excluded"}]
    with pytest.raises(ValueError, match="collection of provider ids"):
        plan_dispatch(one_token((0, 0)), shard, exclude=P(1))


def test_hot_expert_goes_to_the_gpu_holder_a_cold_expert_by_score():
    providers = [provider(1, gpu=True), provider(2)]
    holdings = [holding(1, 0, 0, tps=100), holding(2, 0, 0, tps=900)]
    assert plan_dispatch(one_token((0, 0)), index(providers, holdings, ALWAYS_HOT))["batches"][0]["provider"] == P(1)
    assert plan_dispatch(one_token((0, 0)), index(providers, holdings, NEVER_HOT))["batches"][0]["provider"] == P(2)
    # Backups of a hot expert: GPU holders first, within Warm.
    holdings += [holding(3, 0, 0, tps=5000), holding(4, 0, 0, tps=10)]
    providers += [provider(3), provider(4, gpu=True)]
    batch = plan_dispatch(one_token((0, 0)), index(providers, holdings, ALWAYS_HOT))["batches"][0]
    assert (batch["provider"], batch["backups"]) == (P(1), [P(4), P(3), P(2)])


def test_a_split_hot_expert_spills_from_its_gpu_holder_to_cpu_holders():
    providers = [provider(0, gpu=True)] + [provider(i) for i in range(1, 4)]
    holdings = [holding(i, 0, 0, tps=1000) for i in range(4)]
    plan = plan_dispatch(routings_json(np.zeros((400, 1), np.int64)), index(providers, holdings, ALWAYS_HOT))
    assert {b["provider"] for b in plan["batches"]} == {P(i) for i in range(4)}


def test_shared_expert_is_split_into_pieces_of_at_least_min_batch_rows():
    n_tokens, holders = 4096, 10
    providers = [provider(i) for i in range(holders)]
    holdings = [holding(i, 0, e, tps=500) for i in range(holders) for e in range(65)]
    experts = skewed_routings(np.random.default_rng(0), n_tokens=n_tokens, n_routed=64, top_k=2, n_shared=1)
    plan = plan_dispatch(routings_json(experts), index(providers, holdings))
    shared = [b for b in plan["batches"] if b["expert"] == 64]
    assert len(shared) > 1
    assert all(len(b["token_indices"]) >= MIN_BATCH_ROWS for b in shared)
    assert sorted(t for b in shared for t in b["token_indices"]) == list(range(n_tokens))
    # Consecutive runs of its tokens, in provider order.
    assert [t for b in shared for t in b["token_indices"]] == list(range(n_tokens))


@settings(max_examples=60, deadline=None)
@given(n_tokens=st.integers(1, 400), holders=st.integers(1, 8), min_rows=st.sampled_from([1, 7, 32]),
       tps=st.sampled_from([1, 50, 1000]), latency=st.sampled_from([0.0, 10.0]))
def test_equal_holders_share_one_expert_evenly(n_tokens, holders, min_rows, tps, latency):
    providers = [provider(i, latency_ms=latency) for i in range(holders)]
    shard = index(providers, [holding(i, 0, 0, tps=tps) for i in range(holders)])
    sizes = [len(b["token_indices"]) for b in
             plan_dispatch(routings_json(np.zeros((n_tokens, 1), np.int64)), shard, min_batch_rows=min_rows)["batches"]]
    assert sum(sizes) == n_tokens
    fair = -(-n_tokens // holders)  # the only expert routed: its fair share is rows / holders
    assert len(sizes) == max(1, min(holders, -(-n_tokens // fair), n_tokens // min_rows))
    assert max(sizes) - min(sizes) <= 1
    assert len(sizes) == 1 or min(sizes) >= min_rows


@pytest.mark.parametrize("skew", [0.0, 1.0, 1.5])
def test_load_spreads_over_equal_holders(skew):
    """10 equal Warm holders of every expert, every expert hot: no holder gets more than the
    average plus one expert's rows (the list-scheduling bound the planner documents), and in
    these runs within 10% of the average."""
    holders, n_experts, n_tokens, top_k = 10, 64, 4096, 8
    providers = [provider(i) for i in range(holders)]
    holdings = [holding(i, 0, e, tps=200) for i in range(holders) for e in range(n_experts)]
    shard = index(providers, holdings, POLICY)  # 10 x 200 tps >= 1000: every expert hot
    assert shard.hot.all()
    experts = skewed_routings(np.random.default_rng(1), n_tokens=n_tokens, n_routed=n_experts, top_k=top_k, skew=skew)
    plan = plan_dispatch(routings_json(experts), shard)
    load = rows_per_provider(plan)
    total, average = n_tokens * top_k, n_tokens * top_k / holders
    largest_expert = max(np.bincount(experts.ravel()))
    assert sum(load.values()) == total and len(load) == holders
    assert max(load.values()) <= average + largest_expert
    assert max(load.values()) <= 1.10 * average


def test_pair_arrays_give_a_columnar_plan():
    providers = [provider(1), provider(2)]
    shard = index(providers, [holding(1, 0, 0), holding(2, 0, 1)])
    plan = plan_pairs(np.array([3, 1, 3]), np.array([0, 0, 0]), np.array([1, 0, 5]), shard)
    assert [(b.layer, b.expert, b.provider.provider_id, b.token_indices.tolist()) for b in plan.batches] == [
        (0, 0, P(1), [1]), (0, 1, P(2), [3])]
    assert plan.pair_batch.tolist() == [1, 0, -1]
    assert plan.unroutable == ((3, 0, 5, "no_holder"),)
    assert plan.listed.tolist() == [1, 3]


def test_one_index_serves_many_plans():
    tokens, layers, experts = routings_pairs(np.arange(16).reshape(8, 2) % 3)
    shard = index([provider(1), provider(2)], [holding(1, 0, e) for e in range(3)] + [holding(2, 0, 1)])
    first = plan_pairs(tokens, layers, experts, shard).to_dict()
    assert all(plan_pairs(tokens, layers, experts, shard).to_dict() == first for _ in range(3))


def test_a_decode_steps_backups_are_ranked_only_when_read(monkeypatch):
    """One token's plan leaves its backups unranked until the forward reads them (a hedge or a failover);
    whether a batch has any is known without ranking."""
    from core.shardmap import spread

    ranked: list[int] = []
    real = spread.RankedLater._rank

    def counted(self):
        ranked.append(1)  # one piece's
        return real(self)

    monkeypatch.setattr(spread.RankedLater, "_rank", counted)
    providers = [provider(i) for i in range(1, 5)]
    holdings = [holding(p, 0, e, tps=100 * p) for e in range(8) for p in (1 + e % 4, 1 + (e + 1) % 4)]
    holdings.append(holding(1, 0, 8, tps=100))  # an expert with one holder: no backup
    plan = plan_pairs([0] * 9, [0] * 9, list(range(9)), index(providers, holdings))
    assert len(plan.batches) == 9 and ranked == []
    assert [bool(b.backups) for b in plan.batches] == [True] * 8 + [False] and ranked == []
    first = plan.batches[0]  # expert 0, on P(1) or P(2): the other one is its backup
    other = ({P(1), P(2)} - {first.provider.provider_id}).pop()
    assert [p.provider_id for p in first.backups] == [other]
    assert ranked == [1]  # that batch's alone
    assert [p.provider_id for p in first.backups] == [other] and len(first.backups) == 1 and ranked == [1]  # once
