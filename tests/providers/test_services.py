"""The gossip view in the database: merges, counts, this node's record, the shard map over it."""

import json

import pytest
from django.utils import timezone

from apps.node.selectors import node_identity
from apps.providers import selectors, services
from apps.providers.models import GossipCount, Holding, Provider, Reachability
from apps.providers.records import Holding as RecordHolding
from apps.providers.records import verify_record
from apps.worker import services as worker_services
from testkit.records import heartbeat, new_key, signed_record

pytestmark = pytest.mark.django_db
MODEL = "test/moe-tiny"


def _now() -> int:
    return services.now_ms()


def _holdings(*experts, tps=800, residency="Warm"):
    return tuple(RecordHolding(MODEL, 0, e, residency, tps, None) for e in experts)


def test_a_merge_stores_fields_and_holdings_and_never_rolls_back(django_assert_max_num_queries) -> None:
    key = new_key(1)
    now = _now()
    v2 = signed_record(key, seq=now, at_ms=now, holdings=_holdings(1, 2))
    many = [signed_record(new_key(100 + i), seq=now, at_ms=now, holdings=_holdings(*range(40))) for i in range(5)]
    # the same handful whatever the records and holdings (one of them: the models whose holdings a
    # merge replaces, announced to the dashboard on commit)
    with django_assert_max_num_queries(15):
        assert services.gossip_receive(records=[e.envelope() for e in many], heartbeats=[]) == {"accepted": 5}
    Provider.objects.all().delete()
    GossipCount.objects.all().delete()
    with django_assert_max_num_queries(15):
        assert services.gossip_receive(records=[v2.envelope()], heartbeats=[]) == {"accepted": 1}
    row = Provider.objects.get(provider_id=v2.provider_id)
    assert (row.seq, row.quic_endpoint, row.is_self) == (v2.seq, v2.record.quic_endpoint, False)
    assert sorted(Holding.objects.values_list("expert", flat=True)) == [1, 2]
    older = signed_record(key, seq=now - 1, at_ms=now, holdings=_holdings(9))
    assert services.gossip_receive(records=[older.envelope()], heartbeats=[]) == {"replayed": 1}
    assert sorted(Holding.objects.values_list("expert", flat=True)) == [1, 2]
    v3 = signed_record(key, seq=now + 1, at_ms=now, holdings=_holdings(3))
    services.gossip_receive(records=[v3.envelope()], heartbeats=[heartbeat(key, seq=now + 1, at_ms=now + 5).to_json()])
    assert list(Holding.objects.values_list("expert", flat=True)) == [3]
    assert Provider.objects.get(provider_id=v3.provider_id).alive_ms == now + 5
    assert dict(GossipCount.objects.values_list("verdict", "count")) == {"accepted": 2, "replayed": 1}


def test_a_heartbeat_alone_refreshes_liveness_and_expiry_drops_the_silent(settings) -> None:
    key = new_key(2)
    now = _now()
    old = now - int(settings.TENZRO_GOSSIP_TTL_S * 1000) + 1000  # expires in a second without a heartbeat
    services.gossip_receive(records=[signed_record(key, seq=5, at_ms=old).envelope()], heartbeats=[])
    services.gossip_receive(records=[], heartbeats=[heartbeat(key, seq=5, at_ms=now).to_json()])
    assert services.gossip_expire() == []
    Provider.objects.update(alive_ms=old - 5000)
    assert services.gossip_expire() == [key.verify_key.encode().hex()]
    assert not Holding.objects.exists()


def _worker_publishes(experts, *, tps=800, capacity=5000):
    rows = [{"model_id": MODEL, "layer": 0, "expert": e, "tier": "memory", "memory_bytes": 1, "disk_bytes": 1,
             "d_model": 8, "d_ff": 4, "formats": {}, "blob_uri": None} for e in experts]
    worker_services.worker_state_publish(provider_id="x", pid=1, started_at=timezone.now(), status={
        "experts": rows, "gates": [], "memory_budget_bytes": 1, "memory_used_bytes": 1, "committed_tps": tps,
        "capacity_tps": capacity, "demand": [[MODEL, 0, e, tps] for e in experts], "backend": "cpu",
        "cpu_kernel": "c", "gpu_backend_active": False})


def test_this_nodes_record_is_resigned_only_when_what_it_announces_changes(settings) -> None:
    me = node_identity().provider_id
    _worker_publishes([1])
    first = services.local_record_refresh()
    assert first is not None and first.record.holdings == () and "ExpertHolder" not in first.record.roles
    assert "dial" in selectors.gossip_status()["not_announced_as_holder"]
    services.reachability_record(http_ok=True, quic_ok=False, checked_by="peer", detail="")
    second = services.local_record_refresh()
    assert second.seq > first.seq and [h.expert for h in second.record.holdings] == [1]
    assert second.record.http_endpoint == settings.TENZRO_PUBLIC_HTTP and second.record.quic_endpoint is None
    assert selectors.gossip_status()["not_announced_as_holder"] is None
    settings.TENZRO_GOSSIP_HEARTBEAT_S = 3600
    assert services.local_record_refresh() is None  # nothing changed, heartbeat recent
    _worker_publishes([1], tps=900)  # within the step (25%): no new record
    assert services.local_record_refresh() is None
    _worker_publishes([1], tps=2000)  # past it
    third = services.local_record_refresh()
    assert third.seq > second.seq and third.record.holdings[0].committed_tps == 2000
    assert third.record.holdings[0].capacity_tps == 5000
    _worker_publishes([1], tps=2000, capacity=5500)  # capacity within the step too
    assert services.local_record_refresh() is None
    _worker_publishes([1], tps=2000, capacity=9000)
    fourth = services.local_record_refresh()
    assert fourth.seq > third.seq and fourth.record.holdings[0].capacity_tps == 9000
    third = fourth
    stored = Provider.objects.get(provider_id=me)
    assert verify_record({"record": stored.record_text, "signature": stored.signature}, max_bytes=1 << 20) == third


def test_shard_map_and_plan_over_the_gossip_view(client, django_assert_max_num_queries) -> None:
    now = _now()
    for seed, experts in ((1, (0, 1)), (2, (1,)), (3, (2,))):
        record = signed_record(new_key(seed), seq=now, at_ms=now, holdings=_holdings(*experts))
        services.gossip_receive(records=[record.envelope()], heartbeats=[])
    Reachability.objects.all().delete()

    def rpc(method, params):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        return client.post("/rpc", data=body, content_type="application/json").json()

    # policy, providers, reputation scores, holdings; why this node announces nothing (reachability, worker
    # state) and then its own holdings (two); the model's known shape
    with django_assert_max_num_queries(9):
        shard = rpc("tenzro_moeShardMap", {"model_id": MODEL})["result"]
    assert shard["covered_experts"] == 3 and shard["distinct_providers"] == 3
    assert [h["replication"] for h in shard["holders"]] == [1, 2, 1]
    routings = [{"token_index": t, "experts": [{"layer": 0, "expert": 1}]} for t in range(4)]
    plan = rpc("tenzro_moePlanDispatch", {"model_id": MODEL, "routings": routings})["result"]
    assert sorted(t for b in plan["batches"] for t in b["token_indices"]) == [0, 1, 2, 3]
    assert all(len(b["backups"]) == 1 for b in plan["batches"])
    twice = rpc("tenzro_moePlanDispatch", {"model_id": MODEL, "routings": [
        {"token_index": 0, "experts": [{"layer": 0, "expert": 1}, {"layer": 0, "expert": 1}]}]})
    assert twice["error"]["data"]["reason"] == "invalid_routings"


def test_a_view_of_a_thousand_providers_is_built_and_read_in_a_bounded_number_of_queries(
        django_assert_max_num_queries) -> None:
    now = _now()
    records = [signed_record(new_key(1000 + i), seq=now, at_ms=now, holdings=_holdings(i % 64, (i + 7) % 64))
               for i in range(1000)]
    for start in range(0, 1000, 250):  # a message carries at most 256 records
        # a handful of statements; SQLite splits a bulk insert of 250 rows into a few (its
        # 999-variable limit), PostgreSQL does not
        with django_assert_max_num_queries(24):
            assert services.gossip_receive(records=[r.envelope() for r in records[start:start + 250]],
                                           heartbeats=[])["accepted"] == 250
    with django_assert_max_num_queries(4):  # providers, their reputation scores, holdings, policy
        index = selectors.shard_index(MODEL)
    assert len(index.providers) == 1000
    with django_assert_max_num_queries(2):
        answer = services.gossip_answer_sync(digest={})
    assert len(answer["records"]) == 256 and len(answer["want"]) == 0  # capped per message
    assert Holding.objects.count() == 2000
