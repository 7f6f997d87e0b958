"""ShardIndex: the CSR layout, lookups through the dense table and the binary search."""

from __future__ import annotations

import numpy as np
import pytest

from core.shardmap.index import ShardIndex
from testkit.shard_views import MODEL, POLICY, holding, provider, provider_id


def test_layout_holders_sorted_warm_first_then_tps_then_provider():
    holdings = [holding(3, 1, 0, tps=5), holding(1, 0, 2, warm=False, tps=900), holding(2, 0, 2, tps=10),
                holding(0, 0, 2, tps=10), holding(4, 0, 2, tps=50), holding(9, 0, 2)]  # 9: not in the view
    shard = ShardIndex.build(MODEL, [provider(i) for i in range(5)], holdings, POLICY)
    assert shard.layers.tolist() == [0, 1] and shard.experts.tolist() == [2, 0]
    assert shard.offsets.tolist() == [0, 4, 5]
    assert shard.holder_provider.tolist() == [4, 0, 2, 1, 3]
    assert shard.holder_warm.tolist() == [True, True, True, False, True]
    assert shard.replication.tolist() == [4, 1] and shard.summed_tps.tolist() == [970, 5]
    assert shard.provider_ids() == [provider_id(i) for i in range(5)]
    with pytest.raises(ValueError):
        shard.holder_tps[0] = 1  # read-only


@pytest.mark.parametrize("far_layer", [3, 10**6])  # a small box (dense table) and a sparse one (binary search)
def test_lookup(far_layer):
    holdings = [holding(0, 0, 0), holding(0, 0, 5), holding(0, far_layer, 1)]
    shard = ShardIndex.build(MODEL, [provider(0)], holdings, POLICY)
    assert (shard._table is not None) == (far_layer == 3)
    layers = np.array([0, 0, far_layer, far_layer, 1, 2**31 - 1, 0])
    experts = np.array([0, 5, 1, 0, 0, 0, 2**31 - 1])
    assert shard.lookup(layers, experts).tolist() == [0, 1, 2, -1, -1, -1, -1]


def test_empty_index_looks_up_nothing():
    shard = ShardIndex.build(MODEL, [provider(0)], [], POLICY)
    assert shard.n_experts == 0
    assert shard.lookup(np.array([0, 1]), np.array([0, 0])).tolist() == [-1, -1]


def test_latency_fill_and_gpu_flags():
    providers = [provider(0, latency_ms=None, gpu=True), provider(1, latency_ms=30.0), provider(2, latency_ms=5.0)]
    shard = ShardIndex.build(MODEL, providers, [], POLICY)
    assert shard.provider_latency_s.tolist() == [0.03, 0.03, 0.005]
    assert shard.provider_gpu.tolist() == [True, False, False]
    nobody_measured = ShardIndex.build(MODEL, [provider(0, latency_ms=None)], [], POLICY)
    assert nobody_measured.provider_latency_s.tolist() == [0.0]
