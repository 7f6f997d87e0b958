"""The worker's state in the control plane: publish (diffed), stale reads, blob references."""

import datetime as dt

import pytest
from django.utils import timezone

from apps.blobs.references import referenced_blob_hashes
from apps.worker import selectors, services
from apps.worker.models import HeldExpert, WorkerState
from core.errors import Conflict

pytestmark = pytest.mark.django_db
URI = "tenzro://blob/" + "c" * 64


def _expert(expert, tier="memory", blob_uri=None):
    return {"model_id": "m", "layer": 0, "expert": expert, "tier": tier, "memory_bytes": 100 if tier == "memory" else 0,
            "disk_bytes": 50, "d_model": 8, "d_ff": 4, "formats": {"gate_proj": "Q8_0"}, "blob_uri": blob_uri}


def _status(experts, gates=()):
    return {"experts": list(experts), "gates": list(gates), "memory_budget_bytes": 1000, "memory_used_bytes": 200,
            "committed_tps": 42, "capacity_tps": 9000, "demand": [["m", 0, 1, 42]], "backend": "cpu",
            "cpu_kernel": "c-avx2", "gpu_backend_active": False}


def _publish(status, pid=7):
    return services.worker_state_publish(provider_id="ab" * 32, pid=pid, started_at=timezone.now(), status=status)


def test_published_state_reads_back_equal_to_the_runtime_status() -> None:
    gate = {"model_id": "m", "layer": 0, "router": "softmax", "n_routed": 4, "n_shared_experts": 0, "top_k": 2,
            "d_model": 8, "memory_bytes": 128, "blob_uri": URI}
    status = _status([_expert(0), _expert(1, "disk", URI)], [gate])
    assert _publish(status) == 3
    read = selectors.worker_status_published()
    assert [{k: e[k] for k in _expert(0)} for e in read["experts"]] == status["experts"]
    assert [e["committed_tps"] for e in read["experts"]] == [0, 42]
    assert read["gates"] == [gate]
    assert read["counts"] == {"warm": 1, "cold": 1, "gates": 1}
    assert read["committed_tps"] == 42 and read["capacity_tps"] == 9000
    assert read["stale"] is False and read["worker_pid"] == 7
    # each holding its own demand, every holding the node's capacity
    assert selectors.holdings() == [
        {"model_id": "m", "layer": 0, "expert": 0, "residency": "Warm", "committed_tps": 0, "capacity_tps": 9000,
         "blob_uri": None},
        {"model_id": "m", "layer": 0, "expert": 1, "residency": "Cold", "committed_tps": 42, "capacity_tps": 9000,
         "blob_uri": URI},
    ]


def test_a_publish_writes_only_what_changed(django_assert_max_num_queries) -> None:
    _publish(_status([_expert(e) for e in range(50)]))
    untouched = HeldExpert.objects.get(expert=3).changed_at
    changed = _status([_expert(e, "disk" if e == 7 else "memory") for e in range(50) if e != 9])
    assert _publish(changed) == 2  # expert 7 evicted, expert 9 unloaded
    assert HeldExpert.objects.count() == 49 and HeldExpert.objects.get(expert=7).residency == "Cold"
    assert HeldExpert.objects.get(expert=3).changed_at == untouched
    with django_assert_max_num_queries(8):  # not one query per holding
        assert _publish(changed) == 0


def test_reads_are_a_fixed_number_of_queries(django_assert_num_queries) -> None:
    _publish(_status([_expert(e) for e in range(30)]))
    with django_assert_num_queries(3):
        selectors.worker_status_published()


def test_state_is_stale_after_silence_or_a_clean_stop(settings) -> None:
    assert selectors.worker_status_published()["stale"] is True  # never published
    _publish(_status([_expert(0)]))
    assert selectors.worker_status_published()["stale"] is False
    WorkerState.objects.update(heartbeat_at=timezone.now() - dt.timedelta(seconds=settings.TENZRO_WORKER_STALE_S + 1))
    stale = selectors.worker_status_published()
    assert stale["stale"] is True and [e["expert"] for e in stale["experts"]] == [0]  # last state still there
    services.worker_state_heartbeat(pid=7, status=_status([]))
    assert selectors.worker_status_published()["stale"] is False
    services.worker_state_stopped(pid=7)
    assert selectors.worker_status_published()["stale"] is True


def test_blob_gc_references_come_from_published_holdings() -> None:
    with pytest.raises(Conflict) as info:
        referenced_blob_hashes()
    assert info.value.reason == "state_not_published"
    _publish(_status([_expert(0, blob_uri=URI)]))
    assert "c" * 64 in referenced_blob_hashes()


def test_node_health_names_what_the_node_lacks(monkeypatch, settings) -> None:
    import redis

    from apps.node import selectors as node_selectors

    assert selectors.node_health()["degraded"] == ["worker"]  # nothing ever published
    _publish(_status([_expert(0)]))
    health = selectors.node_health()
    assert health["status"] == "ok" and health["degraded"] == [] and health["checks"]["redis"]["ok"]
    assert health["checks"]["worker"] == {"ok": True, "heartbeat_age_s": health["checks"]["worker"]["heartbeat_age_s"],
                                          "pid": 7}
    # a Redis that does not answer (a closed port): degraded, and the reads still answer
    dead = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    monkeypatch.setattr(node_selectors, "redis_client", lambda: dead)
    health = selectors.node_health()
    assert health["status"] == "degraded" and health["degraded"] == ["redis"], health
    assert "connecting" in health["checks"]["redis"]["error"]
    published = selectors.worker_status_published()
    assert selectors.degraded(published=published, redis=node_selectors.redis_check()) == ["redis"]
