"""Gossip views and routings for the shard-map and planner tests and benchmarks.

``provider`` / ``holding`` build one hand-made view entry with defaults; ``synthetic_view``
builds a network of many providers holding random replicas of every expert;
``skewed_routings`` draws top-k routing decisions in which a few experts are popular.
Everything is seeded: equal arguments give equal views.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.shardmap.gossip_view import HoldingView, ProviderView, ReplicationPolicy

MODEL = "test-moe"
# The governance defaults (docs/specification.md, "Replication policy"), for tests that do not care about their values.
POLICY = ReplicationPolicy(min_replication=2, max_replication=8, hot_threshold_tps=1000)


def provider_id(n: int) -> str:
    """A provider id shaped like a real one (64 hex digits), ordered as n is."""
    return f"{n:064x}"


def provider(n: int, *, roles: tuple[str, ...] = ("ExpertHolder",), gpu: bool = False,
             latency_ms: float | None = 10.0, quic: bool = True, reputation: float = 0.0) -> ProviderView:
    pid = provider_id(n)
    return ProviderView(
        provider_id=pid, roles=roles, http_endpoint=f"http://10.0.{n // 250}.{n % 250}:8000",
        quic_endpoint=f"10.0.{n // 250}.{n % 250}:4433" if quic else None,
        quic_cert_sha256=f"{n:064x}"[::-1] if quic else None, moe_gpu=gpu, latency_ms=latency_ms,
        reputation=reputation)


def holding(n: int, layer: int, expert: int, *, warm: bool = True, tps: int = 100, model: str = MODEL,
            blob: str | None = None, capacity: int | None = None) -> HoldingView:
    """A holding with demand `tps` and capacity `capacity` (default: the same figure as `tps`)."""
    return HoldingView(provider_id=provider_id(n), model_id=model, layer=layer, expert=expert,
                       residency="Warm" if warm else "Cold", committed_tps=tps,
                       capacity_tps=tps if capacity is None else capacity,
                       blob_uri=blob if blob is not None else f"tenzro://blob/{layer:08x}{expert:08x}")


@dataclass(frozen=True)
class SyntheticView:
    providers: list[ProviderView]
    holdings: list[HoldingView]


def synthetic_view(
    rng: np.random.Generator,
    *,
    n_providers: int,
    layers: range,
    n_experts: int,
    replicas: int | tuple[int, int] = 8,
    warm_fraction: float = 0.75,
    gpu_fraction: float = 0.25,
    unknown_latency_fraction: float = 0.1,
    model: str = MODEL,
) -> SyntheticView:
    """``n_providers`` providers; every expert of every layer held by ``replicas`` distinct
    random providers (an int, or a (low, high) inclusive range drawn per expert).

    Each provider has one throughput figure (log-normal around 300 tokens/s), stamped on every
    holding as both its demand (committed_tps) and its capacity (capacity_tps) and one latency (log-normal
    around 20 ms, unknown for ``unknown_latency_fraction`` of them); each holding is Warm
    with probability ``warm_fraction``.
    """
    gpu = rng.random(n_providers) < gpu_fraction
    latency = rng.lognormal(np.log(20.0), 0.6, n_providers)
    unknown = rng.random(n_providers) < unknown_latency_fraction
    tps = np.maximum(rng.lognormal(np.log(300.0), 0.8, n_providers), 0).astype(np.int64)
    providers = [
        ProviderView(provider_id=provider_id(i), roles=("ExpertHolder", "Router") if i % 10 == 0 else ("ExpertHolder",),
                     http_endpoint=f"http://h{i}:8000", quic_endpoint=f"h{i}:4433", quic_cert_sha256=f"{i:064x}",
                     moe_gpu=bool(gpu[i]), latency_ms=None if unknown[i] else float(latency[i]))
        for i in range(n_providers)
    ]
    holdings: list[HoldingView] = []
    ids = [p.provider_id for p in providers]
    tps_list = tps.tolist()
    for layer in layers:
        if isinstance(replicas, int):
            counts = np.full(n_experts, replicas)
        else:
            counts = rng.integers(replicas[0], replicas[1] + 1, n_experts)
        # Distinct holders per expert: the indices of the `most` smallest of uniform noise per expert,
        # a uniform random subset, drawn for the whole layer at once.
        most = min(int(counts.max()), n_providers)
        holders = np.argpartition(rng.random((n_experts, n_providers)), most - 1, axis=1)[:, :most]
        warm = rng.random(holders.shape) < warm_fraction
        for expert in range(n_experts):
            for slot in range(int(counts[expert])):
                p = int(holders[expert, slot])
                holdings.append(HoldingView(
                    provider_id=ids[p], model_id=model, layer=layer, expert=expert,
                    residency="Warm" if warm[expert, slot] else "Cold",
                    committed_tps=tps_list[p], capacity_tps=tps_list[p],
                    blob_uri=f"tenzro://blob/{layer:032x}{expert:032x}"))
    return SyntheticView(providers=providers, holdings=holdings)


def skewed_routings(
    rng: np.random.Generator,
    *,
    n_tokens: int,
    n_routed: int,
    top_k: int,
    n_shared: int = 0,
    layer: int = 0,
    skew: float = 1.0,
) -> np.ndarray:
    """(n_tokens, top_k + n_shared) expert ids: top-k of Zipf-weighted Gumbel noise per token
    (distinct per token, popular experts more often; ``skew`` 0 is uniform), then the shared
    experts n_routed … n_routed + n_shared - 1 on every token. ``layer`` is not used in the
    draw; it names the layer for ``routings_json``."""
    popularity = 1.0 / np.arange(1, n_routed + 1) ** skew
    popularity = popularity[rng.permutation(n_routed)]  # popular experts at random ids
    scores = np.log(popularity)[None, :] + rng.gumbel(size=(n_tokens, n_routed))
    routed = np.argpartition(-scores, top_k - 1, axis=1)[:, :top_k]
    shared = np.broadcast_to(np.arange(n_routed, n_routed + n_shared), (n_tokens, n_shared))
    return np.concatenate([routed, shared], axis=1).astype(np.int64)


def routings_json(experts: np.ndarray, *, layer: int = 0) -> list[dict]:
    """The routings of docs/specification.md for one layer: [{token_index, experts: [{layer, expert}]}]."""
    return [{"token_index": t, "experts": [{"layer": layer, "expert": e} for e in row]}
            for t, row in enumerate(experts.tolist())]


def routings_pairs(experts: np.ndarray, *, layer: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same routings as flat (tokens, layers, experts) pair arrays, token-major."""
    n_tokens, k = experts.shape
    tokens = np.repeat(np.arange(n_tokens, dtype=np.int64), k)
    return tokens, np.full(n_tokens * k, layer, dtype=np.int64), experts.reshape(-1).astype(np.int64)
