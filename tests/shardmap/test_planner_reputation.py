"""Reputation in the planner: below the floor is never a candidate, ties go to the higher score."""

from __future__ import annotations

import pytest

from core.shardmap.aggregation import shard_map
from core.shardmap.gossip_view import ProviderView, ReplicationPolicy
from core.shardmap.index import ShardIndex
from core.shardmap.planner import plan_dispatch
from testkit.shard_views import MODEL, holding, provider, provider_id

P = provider_id
FLOOR = ReplicationPolicy(min_replication=2, max_replication=8, hot_threshold_tps=10**9, reputation_floor=-50.0)


def plan(providers, holdings, *, tokens=1, policy=FLOOR, **kwargs):
    routings = [{"token_index": t, "experts": [{"layer": 0, "expert": 0}]} for t in range(tokens)]
    return plan_dispatch(routings, ShardIndex.build(MODEL, providers, holdings, policy), **kwargs)


def test_a_provider_below_the_floor_is_never_primary_nor_backup():
    # P1 would win on throughput; its reputation is below the floor, so P2 serves and P1 backs nothing up.
    providers = [provider(1, reputation=-50.5), provider(2), provider(3)]
    result = plan(providers, [holding(1, 0, 0, tps=5000), holding(2, 0, 0), holding(3, 0, 0, tps=50)])
    assert [(b["provider"], b["backups"]) for b in result["batches"]] == [(P(2), [P(3)])]
    # At the floor exactly is not below it.
    providers[0] = provider(1, reputation=-50.0)
    result = plan(providers, [holding(1, 0, 0, tps=5000), holding(2, 0, 0), holding(3, 0, 0, tps=50)])
    assert result["batches"][0]["provider"] == P(1)


def test_an_expert_whose_only_holder_is_below_the_floor_is_unroutable_with_that_reason():
    result = plan([provider(1, reputation=-100.0)], [holding(1, 0, 0)], tokens=2)
    assert result["batches"] == []
    assert result["unroutable"] == [{"token_index": t, "layer": 0, "expert": 0, "reason": "below_reputation_floor"}
                                    for t in (0, 1)]


def test_the_reason_names_the_floor_only_when_the_floor_is_what_kept_a_holder_out():
    providers = [provider(1), provider(2, reputation=-60.0)]
    holdings = [holding(1, 0, 0), holding(2, 0, 0)]
    # P1 failed earlier in this forward and P2 is below the floor: the floor is why nobody is left.
    assert plan(providers, holdings, exclude=[P(1)])["unroutable"][0]["reason"] == "below_reputation_floor"
    assert plan(providers, holdings, exclude=[P(1), P(2)])["unroutable"][0]["reason"] == "holders_excluded"


def test_the_default_floor_bars_nobody():
    default = ReplicationPolicy(min_replication=2, max_replication=8, hot_threshold_tps=10**9)
    result = plan([provider(1, reputation=-1e9)], [holding(1, 0, 0)], policy=default)
    assert result["batches"][0]["provider"] == P(1)


def test_equal_finish_times_go_to_the_higher_reputation_then_the_smaller_id():
    holdings = [holding(n, 0, 0) for n in (1, 2, 3)]
    alike = [provider(1), provider(2), provider(3)]
    assert [(b["provider"], b["backups"]) for b in plan(alike, holdings)["batches"]] == [(P(1), [P(2), P(3)])]
    ranked = [provider(1), provider(2, reputation=3.0), provider(3, reputation=7.5)]
    assert [(b["provider"], b["backups"]) for b in plan(ranked, holdings)["batches"]] == [(P(3), [P(2), P(1)])]


def test_reputation_does_not_override_a_better_finish_time():
    providers = [provider(1), provider(2, reputation=1000.0)]
    result = plan(providers, [holding(1, 0, 0, tps=1000), holding(2, 0, 0, tps=100)])
    assert [(b["provider"], b["backups"]) for b in result["batches"]] == [(P(1), [P(2)])]


def test_a_split_expert_fills_the_higher_reputation_first_when_holders_are_alike():
    # 33 rows over two alike holders: 17 + 16, and the odd row goes to the better record.
    providers = [provider(1), provider(2, reputation=5.0)]
    result = plan(providers, [holding(1, 0, 0), holding(2, 0, 0)], tokens=33, min_batch_rows=8)
    rows = {b["provider"]: len(b["token_indices"]) for b in result["batches"]}
    assert rows == {P(1): 16, P(2): 17}


def test_the_shard_map_lists_each_holders_reputation_even_below_the_floor():
    providers = [provider(1, reputation=-70.25), provider(2, reputation=4.5)]
    result = shard_map(MODEL, providers, [holding(1, 0, 0), holding(2, 0, 0)], FLOOR)
    assert [(h["provider"], h["reputation"]) for h in result["holders"][0]["holders"]] == [(P(1), -70.25), (P(2), 4.5)]
    assert result["holders"][0]["replication"] == 2  # replication counts declarations, not reputation


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1"])
def test_a_provider_view_refuses_a_reputation_that_is_not_a_finite_number(bad):
    with pytest.raises(ValueError, match="reputation"):
        ProviderView(P(1), (), None, None, None, False, reputation=bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None])
def test_the_policy_refuses_a_floor_that_is_not_a_number_below_inf(bad):
    with pytest.raises(ValueError, match="reputation_floor"):
        ReplicationPolicy(min_replication=1, max_replication=2, hot_threshold_tps=0, reputation_floor=bad)
