"""The planner with the wire's time per row: a holder's rate is its compute and its path in series."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from core.shardmap.gossip_view import ProviderView, ReplicationPolicy
from core.shardmap.index import ShardIndex
from core.shardmap.planner import PlanInputError, plan_pairs
from core.shardmap.spread import MAX_ROW_SIZES, columns_of
from testkit.shard_views import MODEL, holding, provider, provider_id, routings_pairs

NEVER_HOT = ReplicationPolicy(min_replication=2, max_replication=8, hot_threshold_tps=10**9)
F32_ROW = 2 * 4 * 1024  # a d_model 1024 f32 row, there and back


def view(*specs: tuple[float, float | None] | tuple[float, float | None, int], experts: int = 16) -> ShardIndex:
    """Providers 1.. with (latency_ms, wire_ns_per_byte[, capacity_tps: 20,000]), each holding every
    expert of layer 0."""
    providers = [dataclasses.replace(provider(i + 1, latency_ms=spec[0]), wire_ns_per_byte=spec[1])
                 for i, spec in enumerate(specs)]
    holdings = [holding(i + 1, 0, e, tps=spec[2] if len(spec) > 2 else 20_000)
                for i, spec in enumerate(specs) for e in range(experts)]
    return ShardIndex.build(MODEL, providers, holdings, NEVER_HOT)


def pairs(tokens: int = 64, experts: int = 16, top_k: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return routings_pairs(np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)]))


def rows_of(plan) -> Counter:
    out: Counter = Counter()
    for b in plan.batches:
        out[b.provider.provider_id] += len(b.token_indices)
    return out


def test_a_few_milliseconds_of_round_trip_no_longer_send_every_row_one_way():
    # 256 rows at 20,000 rows/s are 12.8 ms of compute: 15 ms more round trip outweighs them all.
    tokens, layers, experts = pairs()
    compute_only = view((30.0, 100.0), (45.0, 100.0))
    assert rows_of(plan_pairs(tokens, layers, experts, compute_only)) == {provider_id(1): 256}
    # 100 ns a byte, 8 KiB a row: 0.8 ms a row on either path; the rows split about evenly
    split = rows_of(plan_pairs(tokens, layers, experts, compute_only, row_bytes=F32_ROW))
    assert sum(split.values()) == 256 and 0.35 <= split[provider_id(2)] / 256 <= 0.5, split


def test_the_narrower_path_gets_fewer_rows():
    tokens, layers, experts = pairs()
    shard = view((30.0, 20.0), (30.0, 80.0))
    split = rows_of(plan_pairs(tokens, layers, experts, shard, row_bytes=F32_ROW))
    # per row 0.05 ms of compute + 0.16 or 0.66 ms of wire: about 3.3 times the rows on the wider path
    assert 2.5 <= split[provider_id(1)] / split[provider_id(2)] <= 4.5, split


def test_without_a_measured_wire_the_plan_is_the_compute_only_plan_bit_for_bit():
    tokens, layers, experts = pairs()
    for shard in (view((30.0, None), (31.0, None)), view((30.0, 0.0), (31.0, 0.0))):
        plain, weighed = (plan_pairs(tokens, layers, experts, shard, row_bytes=b) for b in (0, F32_ROW))
        assert [(b.expert, b.provider.provider_id, b.token_indices.tolist(), [p.provider_id for p in b.backups])
                for b in plain.batches] == [
                   (b.expert, b.provider.provider_id, b.token_indices.tolist(), [p.provider_id for p in b.backups])
                   for b in weighed.batches]


def test_an_unmeasured_wire_counts_as_the_slowest_measured():
    shard = view((30.0, 40.0), (30.0, None), (30.0, 10.0))
    assert shard.provider_wire_s_per_byte.tolist() == [40e-9, 40e-9, 10e-9]
    assert view((30.0, None), (30.0, None)).provider_wire_s_per_byte.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("tokens", [4, 400])  # a few pieces (ranked over lists) and many (over arrays)
def test_backups_rank_by_the_wire_in_both_rankings(tokens):
    # a near, fast holder takes every row; the three others are alike but for their paths, and every
    # batch's backups run from the wider path to the narrower
    shard = view((30.0, 90.0), (30.0, 10.0), (30.0, 50.0), (1.0, 0.0, 10**8), experts=64)
    t, layers, experts = pairs(tokens=tokens, experts=64, top_k=4)
    plan = plan_pairs(t, layers, experts, shard, row_bytes=F32_ROW)
    assert len(plan.batches) > 32 if tokens == 400 else len(plan.batches) <= 32
    for b in plan.batches:
        assert b.provider.provider_id == provider_id(4)
        assert [p.provider_id for p in b.backups] == [provider_id(2), provider_id(3), provider_id(1)]


def test_row_bytes_and_wire_are_checked():
    tokens, layers, experts = pairs(tokens=2)
    with pytest.raises(PlanInputError, match="row_bytes"):
        plan_pairs(tokens, layers, experts, view((1.0, 1.0)), row_bytes=-1)
    for bad in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="wire_ns_per_byte"):
            ProviderView(provider_id(1), (), None, None, None, False, wire_ns_per_byte=bad)


def test_the_rates_with_the_wire_are_computed_once_per_index_and_row_size():
    tokens, layers, experts = pairs()
    shard = view((30.0, 20.0), (30.0, 80.0))
    first = plan_pairs(tokens, layers, experts, shard, row_bytes=F32_ROW)
    cached = columns_of(shard).with_wire[F32_ROW]
    again = plan_pairs(tokens, layers, experts, shard, row_bytes=F32_ROW)
    assert columns_of(shard).with_wire[F32_ROW] is cached  # not computed again
    assert [b.token_indices.tolist() for b in first.batches] == [b.token_indices.tolist() for b in again.batches]
    for size in range(1, 3 * MAX_ROW_SIZES):
        plan_pairs(tokens, layers, experts, shard, row_bytes=size)
    assert len(columns_of(shard).with_wire) <= MAX_ROW_SIZES
