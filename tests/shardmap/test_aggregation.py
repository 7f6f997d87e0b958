"""The shard map: the shape of docs/specification.md ("Shard map and dispatch plan"), exact values on hand-built
views, thresholds at the boundary."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from core.shardmap.aggregation import shard_map
from core.shardmap.gossip_view import HoldingView, ProviderView, ReplicationPolicy
from testkit.shard_views import MODEL, POLICY, holding, provider, provider_id

P = provider_id
TOP_KEYS = {"model_id", "covered_experts", "distinct_providers", "expert_holders_role_count", "router_role_count",
            "policy", "under_replicated_experts", "hot_experts", "expected_experts", "uncovered_experts", "holders"}
HOLDER_KEYS = {"provider", "residency", "committed_tps", "capacity_tps", "quic_endpoint", "quic_cert_sha256",
               "http_endpoint", "blob_uri", "reputation"}


def test_exact_shape_and_values():
    providers = [provider(1), provider(2, roles=("ExpertHolder", "Router")), provider(3, roles=("Router",)),
                 provider(4, quic=False)]
    holdings = [
        holding(1, 0, 1, tps=800, blob="tenzro://blob/a"),
        holding(2, 0, 1, warm=False, tps=900, blob="tenzro://blob/a"),
        holding(4, 0, 1, tps=800, blob="tenzro://blob/a"),
        holding(2, 3, 5, tps=400, blob="tenzro://blob/b"),
    ]
    p1, p2, p4 = providers[0], providers[1], providers[3]

    def row(p: ProviderView, residency: str, tps: int, blob: str) -> dict:
        return {"provider": p.provider_id, "residency": residency, "committed_tps": tps, "capacity_tps": tps,
                "quic_endpoint": p.quic_endpoint, "quic_cert_sha256": p.quic_cert_sha256,
                "http_endpoint": p.http_endpoint, "blob_uri": blob, "reputation": 0.0}

    assert shard_map(MODEL, providers, holdings, POLICY) == {
        "model_id": MODEL,
        "covered_experts": 2,
        "distinct_providers": 3,
        "expert_holders_role_count": 3,  # providers 1, 2, 4 hold experts and declare ExpertHolder
        "router_role_count": 2,  # providers 2 and 3: a router need hold nothing
        "policy": {"min_replication": 2, "max_replication": 8, "hot_threshold_tps": 1000},
        "under_replicated_experts": [{"layer": 3, "expert": 5}],
        "hot_experts": [{"layer": 0, "expert": 1}],  # 800 + 900 + 800; Cold counts too
        "expected_experts": None, "uncovered_experts": [],  # the model's shape was not given
        "holders": [
            {"layer": 0, "expert": 1, "replication": 3, "holders": [
                row(p1, "Warm", 800, "tenzro://blob/a"),  # Warm first, equal tps: provider id order
                row(p4, "Warm", 800, "tenzro://blob/a"),
                row(p2, "Cold", 900, "tenzro://blob/a")]},
            {"layer": 3, "expert": 5, "replication": 1, "holders": [row(p2, "Warm", 400, "tenzro://blob/b")]},
        ],
    }
    assert providers[3].quic_endpoint is None  # a holder without a QUIC door is listed with nulls


def test_holdings_of_unknown_providers_and_other_models_are_ignored():
    providers = [provider(1), provider(2)]
    holdings = [holding(1, 0, 0), holding(9, 0, 0), holding(9, 0, 1), holding(2, 0, 0, model="other-model")]
    result = shard_map(MODEL, providers, holdings, POLICY)
    assert result["covered_experts"] == 1
    assert result["distinct_providers"] == 1
    assert [h["provider"] for h in result["holders"][0]["holders"]] == [P(1)]
    assert result["under_replicated_experts"] == [{"layer": 0, "expert": 0}]


def test_role_counts_count_distinct_holders_and_every_router():
    providers = [provider(1, roles=("ExpertHolder",)), provider(2, roles=("Replica",)),
                 provider(3, roles=("ExpertHolder", "Router")), provider(4, roles=("Router",))]
    # Provider 1 holds two experts (counted once); 2 holds one without declaring ExpertHolder; 3 holds
    # nothing of this model, so its ExpertHolder role is not counted but its Router role is.
    holdings = [holding(1, 0, 0), holding(1, 0, 1), holding(2, 0, 0), holding(3, 0, 0, model="other-model")]
    result = shard_map(MODEL, providers, holdings, POLICY)
    assert (result["distinct_providers"], result["expert_holders_role_count"], result["router_role_count"]) == (2, 1, 2)


@pytest.mark.parametrize(("holders", "under"), [(1, True), (2, False), (3, False)])
def test_under_replicated_below_min_replication_exactly(holders, under):
    policy = ReplicationPolicy(min_replication=2, max_replication=8, hot_threshold_tps=10**9)
    result = shard_map(MODEL, [provider(i) for i in range(holders)],
                       [holding(i, 0, 0) for i in range(holders)], policy)
    assert result["under_replicated_experts"] == ([{"layer": 0, "expert": 0}] if under else [])
    assert result["holders"][0]["replication"] == holders


@pytest.mark.parametrize(("threshold", "hot"), [(999, True), (1000, True), (1000.5, False), (1001, False)])
def test_hot_at_or_above_the_threshold_on_summed_tps(threshold, hot):
    policy = ReplicationPolicy(min_replication=1, max_replication=8, hot_threshold_tps=threshold)
    # Expert 0 sums 1000 over a Warm and a Cold holder; expert 1 (998) is below every threshold here.
    holdings = [holding(0, 0, 0, tps=600), holding(1, 0, 0, tps=400, warm=False), holding(0, 0, 1, tps=998)]
    result = shard_map(MODEL, [provider(0), provider(1)], holdings, policy)
    assert result["hot_experts"] == ([{"layer": 0, "expert": 0}] if hot else [])
    assert result["policy"]["hot_threshold_tps"] == threshold


def test_expected_experts_without_holders_are_under_replicated():
    policy = ReplicationPolicy(min_replication=1, max_replication=8, hot_threshold_tps=1000)
    holdings = [holding(0, 0, 0), holding(0, 1, 2)]
    expected = [(1, 3), (0, 0), (0, 1), (1, 2), (0, 1)]  # repeats count once; order does not matter
    result = shard_map(MODEL, [provider(0)], holdings, policy, expected=expected)
    assert result["under_replicated_experts"] == [{"layer": 0, "expert": 1}, {"layer": 1, "expert": 3}]
    assert result["covered_experts"] == 2  # expected experts nobody holds are not covered
    assert result["expected_experts"] == 4  # distinct pairs
    assert result["uncovered_experts"] == [{"layer": 0, "expert": 1}, {"layer": 1, "expert": 3}]
    # Covered experts outside `expected` are still reported when under-replicated.
    result = shard_map(MODEL, [provider(0)], holdings, POLICY, expected=[(5, 5)])
    assert result["under_replicated_experts"] == [{"layer": 0, "expert": 0}, {"layer": 1, "expert": 2},
                                                  {"layer": 5, "expert": 5}]


@pytest.mark.parametrize("bad", [[(0,)], [(0, -1)], [("0", 1)], [(True, 1)], [0]])
def test_malformed_expected_is_refused(bad):
    with pytest.raises(ValueError, match=r"expected\[0\]"):
        shard_map(MODEL, [provider(0)], [holding(0, 0, 0)], POLICY, expected=bad)


def test_a_provider_listing_one_expert_twice_counts_once_with_its_better_copy():
    copies = [holding(1, 0, 0, warm=False, tps=900, blob="tenzro://blob/c"),
              holding(1, 0, 0, tps=100, blob="tenzro://blob/w"),
              holding(1, 0, 0, tps=100, blob=""),  # tied on residency and tps: the smaller blob_uri wins
              holding(2, 0, 0, tps=500)]
    for seed in range(6):
        random.Random(seed).shuffle(copies)
        entry = shard_map(MODEL, [provider(1), provider(2)], copies, POLICY)["holders"][0]
        assert entry["replication"] == 2
        assert [(h["provider"], h["residency"], h["committed_tps"], h["blob_uri"]) for h in entry["holders"]] == [
            (P(2), "Warm", 500, holding(2, 0, 0).blob_uri), (P(1), "Warm", 100, "")]


def test_blob_uri_beats_none_between_tied_copies():
    copies = [replace(holding(1, 0, 0), blob_uri=None), holding(1, 0, 0)]
    for ordered in (copies, copies[::-1]):
        entry = shard_map(MODEL, [provider(1)], ordered, POLICY)["holders"][0]
        assert entry["holders"][0]["blob_uri"] == holding(1, 0, 0).blob_uri


def test_independent_of_the_order_the_view_is_given_in():
    rng = random.Random(7)
    providers = [provider(i, gpu=i % 3 == 0) for i in range(12)]
    holdings = [holding(rng.randrange(14), rng.randrange(3), rng.randrange(6), warm=rng.random() < 0.6,
                        tps=rng.choice([0, 100, 250, 250, 900])) for _ in range(120)]
    expected = [(layer, e) for layer in range(3) for e in range(7)]
    first = shard_map(MODEL, providers, holdings, POLICY, expected=expected)
    for _ in range(5):
        rng.shuffle(providers)
        rng.shuffle(holdings)
        again = shard_map(MODEL, providers, holdings, POLICY, expected=expected[::-1])
        assert again == first


def test_empty_view():
    assert shard_map(MODEL, [], [], POLICY, expected=[(0, 0)]) == {
        "model_id": MODEL, "covered_experts": 0, "distinct_providers": 0, "expert_holders_role_count": 0,
        "router_role_count": 0, "policy": POLICY.to_dict(), "under_replicated_experts": [{"layer": 0, "expert": 0}],
        "hot_experts": [], "expected_experts": 1, "uncovered_experts": [{"layer": 0, "expert": 0}], "holders": []}


def test_result_keys_are_exactly_seed_000s():
    result = shard_map(MODEL, [provider(0)], [holding(0, 0, 0)], POLICY)
    assert set(result) == TOP_KEYS
    assert set(result["holders"][0]) == {"layer", "expert", "replication", "holders"}
    assert set(result["holders"][0]["holders"][0]) == HOLDER_KEYS


def test_a_view_naming_one_provider_twice_is_refused():
    with pytest.raises(ValueError, match="appears twice"):
        shard_map(MODEL, [provider(1), provider(1)], [], POLICY)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: HoldingView(P(1), MODEL, 0, 0, "Hot", 1), "residency"),
    (lambda: HoldingView(P(1), MODEL, -1, 0, "Warm", 1), "layer"),
    (lambda: HoldingView(P(1), MODEL, 0, True, "Warm", 1), "expert"),
    (lambda: HoldingView(P(1), MODEL, 0, 2**31, "Warm", 1), "expert"),
    (lambda: HoldingView(P(1), MODEL, 0, 0, "Warm", -1), "committed_tps"),
    (lambda: HoldingView(P(1), MODEL, 0, 0, "Warm", 1.5), "committed_tps"),
    (lambda: HoldingView(P(1), MODEL, 0, 0, "Warm", 1, None, -1), "capacity_tps"),
    (lambda: ProviderView("", (), None, None, None, False), "provider_id"),
    (lambda: ProviderView(P(1), ["Router"], None, None, None, False), "roles"),
    (lambda: ProviderView(P(1), (), None, None, None, 1), "moe_gpu"),
    (lambda: ProviderView(P(1), (), None, None, None, False, float("nan")), "latency_ms"),
    (lambda: ProviderView(P(1), (), None, None, None, False, -1.0), "latency_ms"),
    (lambda: ReplicationPolicy(0, 8, 1000), "min_replication"),
    (lambda: ReplicationPolicy(2, 8, -1), "hot_threshold_tps"),
    (lambda: ReplicationPolicy(2, 8, float("inf")), "hot_threshold_tps"),
])
def test_views_refuse_malformed_values(build, match):
    with pytest.raises(ValueError, match=match):
        build()
