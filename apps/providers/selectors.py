"""Reads of the gossip view: the node's gossip status, and the shard views the planner reads.

Each read is a bounded number of queries whatever the number of providers: the shard view of
a model is three (providers, their reputation scores, that model's holdings) plus the active policy.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db.models import Count

from apps.blobs.peers import PeerBlobEndpoint
from apps.catalog.selectors import expected_experts
from apps.governance.selectors import policy_active
from apps.node.selectors import node_identity, own_name
from apps.providers.models import GossipCount, Holding, Provider, Reachability
from apps.providers.records import Holding as RecordHolding
from apps.reputation.selectors import reputation_scores
from apps.worker import selectors as worker_selectors
from core.shardmap.aggregation import shard_map_of
from core.shardmap.gossip_view import HoldingView, ProviderView, ReplicationPolicy
from core.shardmap.index import ShardIndex


def replication_policy() -> ReplicationPolicy:
    policy = policy_active()
    return ReplicationPolicy(min_replication=policy.min_replication, max_replication=policy.max_replication,
                             hot_threshold_tps=float(policy.hot_threshold_tps),
                             reputation_floor=float(policy.reputation_floor))


def wire_as_of(wire_ns_per_byte: float | None, measured_ms: int | None, now_ms: int) -> float | None:
    """A measured wire time per byte as the planner counts it at `now_ms`: halved for every
    TENZRO_FORWARD_WIRE_HALF_LIFE_S since it was measured. A holder measured narrow is given few rows
    or none, and so is not measured again; decayed, it is tried again once its figure no longer
    outweighs the others', and that forward measures its path anew."""
    if wire_ns_per_byte is None or measured_ms is None:
        return wire_ns_per_byte
    age_s = max(0.0, (now_ms - measured_ms) / 1000.0)
    return wire_ns_per_byte * 0.5 ** (age_s / settings.TENZRO_FORWARD_WIRE_HALF_LIFE_S)


def provider_views() -> list[ProviderView]:
    """Every provider of the gossip view with its reputation (two queries: providers, scores)."""
    rows = Provider.objects.values_list("provider_id", "roles", "http_endpoint", "quic_endpoint",
                                        "quic_cert_sha256", "moe_gpu", "latency_ms", "activation_codecs",
                                        "price_per_input_token", "execute_batches", "wire_ns_per_byte",
                                        "wire_measured_ms")
    scores = reputation_scores()  # all of them: fewer rows than the provider table, and no IN list to build
    now_ms = int(time.time() * 1000)  # as services.now_ms (which imports this module)
    return [ProviderView(pid, tuple(roles), http, quic, pin, gpu, latency, tuple(codecs or ("f32",)),
                         scores.get(pid, 0.0), price, batches, wire_as_of(wire, measured, now_ms))
            for pid, roles, http, quic, pin, gpu, latency, codecs, price, batches, wire, measured in rows]


def holding_views(model_id: str, *, layer: int | None = None, expert: int | None = None) -> list[HoldingView]:
    """The model's holdings (one query); only one (layer, expert)'s when both are given."""
    held = Holding.objects.filter(model_id=model_id)
    if layer is not None and expert is not None:
        held = held.filter(layer=layer, expert=expert)
    rows = held.values_list(
        "provider__provider_id", "layer", "expert", "residency", "committed_tps", "blob_uri", "capacity_tps")
    return [HoldingView(pid, model_id, layer, expert, residency, tps, blob, capacity)
            for pid, layer, expert, residency, tps, blob, capacity in rows]


def shard_index(model_id: str) -> ShardIndex:
    """The model's holders as the planner and the shard map read them (four queries)."""
    return ShardIndex.build(model_id, provider_views(), holding_views(model_id), replication_policy())


def _unannounced_reason(reach: Reachability | None, *, stale: bool) -> str | None:
    """Why this node announces no holdings now (None: it announces them)."""
    if not (reach and (reach.http_ok or reach.quic_ok)):
        return ("no peer has dialed this node back yet" if reach is None else
                f"a peer could not dial this node back ({reach.detail or 'no endpoint answered'})")
    if stale:
        return "the expert worker is not reporting (its state is stale)"
    return None


def shard_index_seen(model_id: str, *, layer: int | None = None, expert: int | None = None,
                     ) -> tuple[ShardIndex, dict[str, Any] | None]:
    """The model's shard index as this node sees it: the gossip view, plus this node's own holdings when
    it does not announce them, and then {provider, reason, experts} saying so (else None). With `layer`
    and `expert`, that one expert's holders only."""
    identity = node_identity()
    providers, holdings = provider_views(), holding_views(model_id, layer=layer, expert=expert)
    reason = _unannounced_reason(Reachability.objects.filter(pk=1).first(), stale=worker_selectors.worker_stale())
    unannounced = None
    mine = [] if reason is None else [
        HoldingView(identity.provider_id, model_id, h["layer"], h["expert"], h["residency"], h["committed_tps"],
                    h["blob_uri"], h["capacity_tps"])
        for h in worker_selectors.holdings()
        if h["model_id"] == model_id and (layer is None or (h["layer"], h["expert"]) == (layer, expert))]
    if mine:
        unannounced = {"provider": identity.provider_id, "reason": reason, "experts": len(mine)}
        holdings = [h for h in holdings if h.provider_id != identity.provider_id] + mine
        if all(p.provider_id != identity.provider_id for p in providers):
            providers.append(ProviderView(identity.provider_id, tuple(sorted(settings.TENZRO_ROLES)),
                                          None, None, None, False, None))
    return ShardIndex.build(model_id, providers, holdings, replication_policy()), unannounced


def mark_announced(entries: list[dict[str, Any]], unannounced: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Set `announced` on every holder row of shard map entries (false: this node's unannounced own)."""
    mine = None if unannounced is None else unannounced["provider"]
    for entry in entries:
        for holder in entry["holders"]:
            holder["announced"] = holder["provider"] != mine
    return entries


def shard_map_view(model_id: str) -> dict[str, Any]:
    """tenzro_moeShardMap: shard_index_seen's index as the shard map, counted against the whole model
    when its shape is known (`expected_experts`, `uncovered_experts`), with `unannounced`."""
    index, unannounced = shard_index_seen(model_id)
    out = shard_map_of(index, expected=expected_experts(model_id))
    mark_announced(out["holders"], unannounced)
    out["unannounced"] = unannounced
    return out


def held_models() -> list[str]:
    """The models some provider of the gossip view holds an expert of, sorted (one query)."""
    return list(Holding.objects.order_by("model_id").values_list("model_id", flat=True).distinct())


def blob_holder_endpoints(blob_hash: str) -> list[PeerBlobEndpoint]:
    """Where to ask for this blob, likely holders first (two queries): the providers whose holdings
    announce it (QUIC door first, lowest measured latency first), then up to TENZRO_BLOB_ASK_PROVIDERS
    other providers with a QUIC door, lowest latency first: a gate, or experts prepared but not loaded
    yet, are stored by whoever prepared them without being announced. A provider without the blob
    answers not_found in one round trip."""
    fields = ("provider_id", "quic_endpoint", "quic_cert_sha256", "http_endpoint", "latency_ms")
    announcing = (Provider.objects.filter(holdings__blob_uri=f"tenzro://blob/{blob_hash}", is_self=False)
                  .distinct().values_list(*fields))
    ranked = sorted(announcing, key=lambda r: (r[1] is None, r[4] is None, r[4] or 0.0))
    holders = {r[0] for r in ranked}
    others = (Provider.objects.filter(is_self=False, quic_endpoint__isnull=False, quic_cert_sha256__isnull=False)
              .exclude(provider_id__in=holders).values_list(*fields))
    ranked += sorted(others, key=lambda r: (r[4] is None, r[4] or 0.0, r[0]))[:settings.TENZRO_BLOB_ASK_PROVIDERS]
    return [PeerBlobEndpoint(quic, pin, http, provider_id=pid, announces=pid in holders)
            for pid, quic, pin, http, _ in ranked if (quic and pin) or http]


def announcement() -> tuple[dict[str, Any], str | None]:
    """What this node may announce now, and why it announces no holdings (None when it does)."""
    reach = Reachability.objects.filter(pk=1).first()
    http_ok, quic_ok = (reach.http_ok, reach.quic_ok) if reach else (False, False)
    identity = node_identity()
    state = worker_selectors.worker_status_published()
    roles = set(settings.TENZRO_ROLES)
    reason = _unannounced_reason(reach, stale=state["stale"])
    holdings = () if reason else tuple(
        RecordHolding(h["model_id"], h["layer"], h["expert"], h["residency"], h["committed_tps"], h["blob_uri"],
                      h["capacity_tps"])
        for h in worker_selectors.holdings())
    if reason:
        roles.discard("ExpertHolder")  # still a router: it can gate and dispatch to others
    return {
        "roles": tuple(sorted(roles)),
        "http_endpoint": settings.TENZRO_PUBLIC_HTTP if http_ok else None,
        "quic_endpoint": settings.TENZRO_PUBLIC_QUIC if quic_ok else None,
        "quic_cert_sha256": identity.cert_sha256 if quic_ok else None,
        "moe_gpu": bool(state["gpu_backend_active"]),
        "price_per_input_token": settings.TENZRO_PRICE_PER_INPUT_TOKEN,
        "holdings": holdings,
        "activation_codecs": tuple(settings.TENZRO_ACTIVATION_CODECS),
        "execute_batches": settings.TENZRO_EXECUTE_BATCHES,
        "name": own_name(identity.provider_id),
    }, reason


def gossip_status() -> dict[str, Any]:
    """What this node announces, why not more, and what its gossip refused."""
    identity = node_identity()
    me = Provider.objects.filter(provider_id=identity.provider_id).annotate(n=Count("holdings")).first()
    reach = Reachability.objects.filter(pk=1).first()
    _, not_announced = announcement()
    return {
        "provider_id": identity.provider_id,
        "known_providers": Provider.objects.exclude(provider_id=identity.provider_id).count(),
        "record": None if me is None else {
            "seq": me.seq, "issued_at_ms": me.issued_at_ms, "roles": me.roles, "http_endpoint": me.http_endpoint,
            "quic_endpoint": me.quic_endpoint, "holdings": me.n, "moe_gpu": me.moe_gpu,
            "price_per_input_token": me.price_per_input_token},
        "reachability": None if reach is None else {
            "http": reach.http_ok, "quic": reach.quic_ok, "checked_by": reach.checked_by,
            "checked_at": reach.checked_at.isoformat() if reach.checked_at else None, "detail": reach.detail},
        "not_announced_as_holder": not_announced,
        "verdicts": dict(GossipCount.objects.values_list("verdict", "count")),
    }


def liveness(age_s: float, *, heartbeat_s: float, ttl_s: float) -> str:
    """alive: a heartbeat within two intervals (one may be in flight through gossip); dead: silent for
    the TTL, so the next expiry drops it; suspect between. static/dashboard/network.js does the same."""
    if age_s >= ttl_s:
        return "dead"
    return "alive" if age_s <= 2 * heartbeat_s else "suspect"


def provider_rows(provider_ids: list[str] | None = None, *, now_ms: int) -> list[dict[str, Any]]:
    """The gossip view as the dashboard's network page lists it: name, roles, endpoints, GPU flag, last
    liveness (alive_ms, its age at `now_ms` and alive/suspect/dead), holdings count and reputation. Two
    queries whatever the number of providers (providers with their holdings counted, then their scores);
    `provider_ids` narrows it."""
    rows = Provider.objects.annotate(holdings_count=Count("holdings")).order_by("-is_self", "provider_id")
    if provider_ids is not None:
        rows = rows.filter(provider_id__in=provider_ids)
    values = list(rows.values("provider_id", "name", "is_self", "seq", "roles", "http_endpoint", "quic_endpoint",
                              "moe_gpu", "alive_ms", "latency_ms", "wire_ns_per_byte", "wire_measured_ms",
                              "holdings_count"))
    scores = reputation_scores([v["provider_id"] for v in values]) if provider_ids is not None else reputation_scores()
    heartbeat_s, ttl_s = settings.TENZRO_GOSSIP_HEARTBEAT_S, settings.TENZRO_GOSSIP_TTL_S
    for v in values:
        v["reputation"] = scores.get(v["provider_id"], 0.0)
        v["age_s"] = max(0.0, (now_ms - v["alive_ms"]) / 1000)
        v["liveness"] = liveness(v["age_s"], heartbeat_s=heartbeat_s, ttl_s=ttl_s)
        v["wire_ns_per_byte"] = wire_as_of(v["wire_ns_per_byte"], v.pop("wire_measured_ms"), now_ms)
    return values


def provider_names(provider_ids: list[str] | None = None) -> dict[str, str]:
    """Provider id -> the name its record carries, for the providers in the gossip view that have one
    (all of them, or those of `provider_ids`). One query."""
    rows = Provider.objects.exclude(name="")
    if provider_ids is not None:
        rows = rows.filter(provider_id__in=provider_ids)
    return dict(rows.values_list("provider_id", "name"))


def provider_ids_named(name: str) -> list[str]:
    """The ids of the providers whose record carries `name` (names are not unique: maybe several)."""
    return list(Provider.objects.filter(name=name).values_list("provider_id", flat=True))
