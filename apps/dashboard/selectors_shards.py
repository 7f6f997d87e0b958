"""Reads behind the shard map and dispatch pages: the shard view of a model, made compact for a heatmap.

A bounded number of queries whatever the number of providers or holdings: the shard index is four
(apps.providers.selectors.shard_index_seen), two more for why this node announces nothing and two for
its own holdings then, the model list two.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from apps.providers import selectors as provider_selectors
from apps.worker.selectors import held_model_ids
from core.shardmap.aggregation import shard_map_of
from core.shardmap.index import ShardIndex

# A heatmap wider or taller than this is not drawn (a malformed record naming expert 2**31-1
# must not make the page allocate a huge grid); the page says so instead.
MAX_GRID_CELLS = 1 << 20


def shardmap_models() -> list[str]:
    """The models the gossip view holds experts of, and this node's own (announced or not)."""
    return sorted({*provider_selectors.held_models(), *held_model_ids()})


def shardmap_grid(*, model_id: str) -> dict[str, Any]:
    """The model's replication as a dense layer x expert grid, JSON-ready::

        {model_id, n_layers, n_experts, replication: [n_layers * n_experts ints, row-major by layer],
         hot: [[layer, expert]], under: [[layer, expert]], policy: {...}, covered_experts,
         distinct_providers, too_large: bool, unannounced: {provider, reason, experts} | null}

    Cells nobody holds have replication 0 and count as under-replicated (min_replication >= 1). This
    node's own holdings count even while it does not announce them (`unannounced` says why).
    """
    index, unannounced = provider_selectors.shard_index_seen(model_id)
    return {**grid_of(index), "unannounced": unannounced}


def grid_of(index: ShardIndex) -> dict[str, Any]:
    policy = index.policy
    layers, experts = index.layers, index.experts
    n_layers = int(layers.max()) + 1 if len(layers) else 0
    n_experts = int(experts.max()) + 1 if len(experts) else 0
    base = {"model_id": index.model_id, "policy": policy.to_dict(), "covered_experts": index.n_experts,
            "distinct_providers": len(np.unique(index.holder_provider)),
            "n_layers": n_layers, "n_experts": n_experts}
    if n_layers * n_experts > MAX_GRID_CELLS:
        return {**base, "too_large": True, "replication": [], "hot": [], "under": []}
    grid = np.zeros((n_layers, n_experts), np.int64)  # (n_layers, n_experts)
    grid[layers, experts] = index.replication
    hot = np.zeros_like(grid, dtype=bool)
    hot[layers[index.hot], experts[index.hot]] = True
    under = grid < policy.min_replication
    return {**base, "too_large": False, "replication": grid.ravel().tolist(),
            "hot": np.argwhere(hot).tolist(), "under": np.argwhere(under).tolist()}


def shardmap_cell(*, model_id: str, layer: int, expert: int) -> dict[str, Any]:
    """One (layer, expert)'s holders as the shard map lists them (tenzro_moeShardMap's entry), or an
    entry with replication 0 and no holders."""
    index, unannounced = provider_selectors.shard_index_seen(model_id, layer=layer, expert=expert)
    entries = provider_selectors.mark_announced(shard_map_of(index)["holders"], unannounced)
    return entries[0] if entries else {"layer": layer, "expert": expert, "replication": 0, "holders": []}
