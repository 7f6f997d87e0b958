"""The shard map: every holder's declaration of one model, aggregated (``tenzro_moeShardMap``).

Pure module (no Django). The shape is docs/specification.md's, with one deliberate difference: docs/specification.md
gives each holder an ``iroh_endpoint_id``; this network dials holders over QUIC at
``quic_endpoint`` ("host:port") and pins ``quic_cert_sha256`` from their signed record, so
those two fields stand where ``iroh_endpoint_id`` stood. The result also names its
``model_id``. ::

    {model_id, covered_experts, distinct_providers, expert_holders_role_count,
     router_role_count, policy: {min_replication, max_replication, hot_threshold_tps},
     under_replicated_experts: [{layer, expert}], hot_experts: [{layer, expert}],
     expected_experts: int | null, uncovered_experts: [{layer, expert}],
     holders: [{layer, expert, replication,
                holders: [{provider, residency, committed_tps, capacity_tps, quic_endpoint,
                           quic_cert_sha256, http_endpoint, blob_uri, reputation}]}]}

Semantics (what is dropped while indexing is in core.shardmap.index):
  covered_experts            distinct (layer, expert) with at least one holder
  distinct_providers         distinct providers holding at least one expert of the model
  expert_holders_role_count  of those distinct providers, how many declare role ExpertHolder
  router_role_count          of ALL providers in the view, how many declare role Router: a
                             router gates and fans out, and need hold nothing itself
  replication                distinct providers holding that (layer, expert)
  under_replicated_experts   covered experts with replication < min_replication, plus the
                             ``expected`` experts nobody holds (replication 0)
  hot_experts                experts whose holders' committed_tps (demand; Warm and Cold) sum
                             to at least hot_threshold_tps
  expected_experts           how many (layer, expert) the model has when its shape is known
                             (``expected``), else null
  uncovered_experts          the ``expected`` experts nobody holds
  reputation                 the holder's score as this node sees it (apps.reputation); one
                             below the policy's reputation_floor is listed but never planned on
Lists are sorted by (layer, expert); each entry's holders are Warm first, then
capacity_tps descending, then provider id.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from core.shardmap.gossip_view import HoldingView, ProviderView, ReplicationPolicy, check_id
from core.shardmap.index import ShardIndex, expert_keys


def shard_map(
    model_id: str,
    providers: Iterable[ProviderView],
    holdings: Iterable[HoldingView],
    policy: ReplicationPolicy,
    *,
    expected: Iterable[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """The shard map (docs/specification.md) of ``model_id`` over the view (see the module docstring).

    ``expected``: the (layer, expert) pairs the catalog says exist; those nobody holds are
    reported as under-replicated. Raises ValueError on a malformed pair or a view that names
    a provider twice.
    """
    return shard_map_of(ShardIndex.build(model_id, providers, holdings, policy), expected=expected)


def shard_map_of(index: ShardIndex, *, expected: Iterable[tuple[int, int]] | None = None) -> dict[str, Any]:
    """The shard map of an already built index (a forward that holds one need not rebuild it)."""
    policy = index.policy
    layers, experts = index.layers.tolist(), index.experts.tolist()
    under = index.replication < policy.min_replication
    wanted = None if expected is None else _expected_pairs(expected)
    missing = _uncovered(index, wanted)

    providers = index.providers
    holding_any = np.unique(index.holder_provider).tolist()
    return {
        "model_id": index.model_id,
        "covered_experts": index.n_experts,
        "distinct_providers": len(holding_any),
        "expert_holders_role_count": sum("ExpertHolder" in providers[i].roles for i in holding_any),
        "router_role_count": sum("Router" in p.roles for p in providers),
        "policy": policy.to_dict(),
        "under_replicated_experts": _pairs(sorted(
            [(layers[i], experts[i]) for i in np.flatnonzero(under).tolist()] + missing)),
        "hot_experts": _pairs([(layers[i], experts[i]) for i in np.flatnonzero(index.hot).tolist()]),
        "expected_experts": None if wanted is None else len(wanted),
        "uncovered_experts": _pairs(missing),
        "holders": _holder_entries(index, layers, experts),
    }


def _pairs(pairs: Iterable[tuple[int, int]]) -> list[dict[str, int]]:
    return [{"layer": layer, "expert": expert} for layer, expert in pairs]


def _expected_pairs(expected: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """The distinct expected (layer, expert) pairs, checked."""
    wanted = set()
    for n, pair in enumerate(expected):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise ValueError(f"expected[{n}] must be a (layer, expert) pair, got {pair!r}")
        wanted.add((check_id(pair[0], f"expected[{n}] layer"), check_id(pair[1], f"expected[{n}] expert")))
    return wanted


def _uncovered(index: ShardIndex, wanted: set[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """The expected (layer, expert) pairs that no holder covers, sorted."""
    if not wanted:
        return []
    pairs = sorted(wanted)
    keys = expert_keys(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    held = np.isin(keys, index.keys)
    return [pair for pair, h in zip(pairs, held.tolist(), strict=True) if not h]


def _holder_entries(index: ShardIndex, layers: list[int], experts: list[int]) -> list[dict[str, Any]]:
    # The per-provider fields are the same in every entry of that provider: look them up once.
    doors = [(p.provider_id, p.quic_endpoint, p.quic_cert_sha256, p.http_endpoint, float(p.reputation))
             for p in index.providers]
    residency = ("Cold", "Warm")  # indexed by the warm flag
    rows = [
        {"provider": door[0], "residency": residency[warm], "committed_tps": tps, "capacity_tps": cap,
         "quic_endpoint": door[1],
         "quic_cert_sha256": door[2], "http_endpoint": door[3], "blob_uri": blob, "reputation": door[4]}
        for door, warm, tps, cap, blob in zip(
            [doors[p] for p in index.holder_provider.tolist()], index.holder_warm.tolist(),
            index.holder_tps.tolist(), index.holder_capacity.tolist(), index.holder_blob, strict=True)
    ]
    offsets = index.offsets.tolist()
    return [
        {"layer": layers[i], "expert": experts[i], "replication": offsets[i + 1] - offsets[i],
         "holders": rows[offsets[i]:offsets[i + 1]]}
        for i in range(index.n_experts)
    ]
