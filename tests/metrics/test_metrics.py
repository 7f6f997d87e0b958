"""Prometheus metrics (core/metrics.py): what each part counts, /metrics, and multiprocess mode.

In-process, against the real prometheus_client registry: each test reads a sample before and
after, since the counters live for the whole test session.
"""

import asyncio
import json
import os
import subprocess
import sys

import pytest
from django.test import Client, override_settings
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from apps.api.metrics_middleware import route_kind
from apps.api.metrics_view import metrics_registry
from apps.forward.handlers import _count
from apps.forward.report import Failure, ForwardReport, HolderStats
from apps.node.supervisor import _empty_metrics_dir, _metrics_process_dead
from apps.worker.doors import METHOD_DOORS, CallContext, Door, MethodTable
from apps.worker.server import _tier_gauges
from core.metrics import reason_label
from core.transport.framing import Reply

TOKEN = "test-operator-token"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.django_db
def test_metrics_endpoint_serves_the_exposition_format_with_rpc_and_http_counts(client: Client) -> None:
    before = sample("tenzro_rpc_requests_total", method="tenzro_nodeInfo", outcome="ok")
    unknown = sample("tenzro_rpc_requests_total", method="other", outcome="method_not_found")
    rpc_2xx = sample("tenzro_http_requests_total", kind="rpc", status="2xx")
    client.post("/rpc", data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_nodeInfo"}),
                content_type="application/json")
    client.post("/rpc", data=json.dumps({"jsonrpc": "2.0", "id": 2, "method": "made_up_by_a_client"}),
                content_type="application/json")
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(answer.content.decode())}
    assert {"tenzro_rpc_requests", "tenzro_http_requests"} <= set(families)
    assert sample("tenzro_rpc_requests_total", method="tenzro_nodeInfo", outcome="ok") == before + 1
    assert sample("tenzro_rpc_requests_total", method="other", outcome="method_not_found") == unknown + 1
    assert sample("tenzro_http_requests_total", kind="rpc", status="2xx") == rpc_2xx + 2
    assert not any("made_up_by_a_client" in s.labels.get("method", "")
                   for f in families.values() for s in f.samples)


@override_settings(TENZRO_METRICS_PUBLIC=False)
def test_metrics_can_be_put_behind_the_operator_token(client: Client) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_a_forward_report_counts_batches_failures_and_receipts() -> None:
    report = ForwardReport()
    report.holders["a"] = HolderStats("a", transport="quic", batches=3, receipts=[object(), object(), object()])
    report.holders["b"] = HolderStats("b", transport="", batches=2)  # this node's own work
    report.holders["e"] = HolderStats("e", transport="quic", batches=4, lanes={0, 1, 3})  # split over 3 lanes
    report.failures += [Failure("c", "timeout", "", 0, 1, 4), Failure("c", "bad_receipt", "", 0, 2, 4),
                        Failure("d", "reason-a-holder-made-up", "", 0, 3, 4)]
    names = [("tenzro_forward_batches_total", {"transport": "quic"}),
             ("tenzro_forward_batches_total", {"transport": "local"}),
             ("tenzro_holder_failures_total", {"reason": "timeout"}),
             ("tenzro_holder_failures_total", {"reason": "other"}),
             ("tenzro_receipts_total", {"event": "verified"}), ("tenzro_receipts_total", {"event": "rejected"}),
             ("tenzro_forward_lane_parts_total", {})]
    before = [sample(n, **labels) for n, labels in names]
    _count(report)
    after = [sample(n, **labels) for n, labels in names]
    assert [b - a for a, b in zip(before, after, strict=True)] == [7, 2, 1, 1, 3, 1, 3]
    assert reason_label("stalled") == "stalled" and reason_label(None) == "other"


def test_worker_calls_are_counted_by_door_method_and_outcome() -> None:
    async def ok(params, body, ctx):
        return {}, b""

    table = MethodTable(dict.fromkeys(METHOD_DOORS, ok))
    key = {"door": "peer", "method": "moe/expert_load", "outcome": "forbidden"}
    before = sample("tenzro_worker_requests_total", **key), sample(
        "tenzro_worker_requests_total", door="peer", method="other", outcome="method_not_found")

    async def calls() -> list[Reply]:
        ctx = CallContext(Door.PEER, peer=("192.0.2.1", 1))
        return [await table.call("moe/expert_load", {}, b"", ctx), await table.call("x" * 200, {}, b"", ctx)]

    asyncio.run(calls())
    assert sample("tenzro_worker_requests_total", **key) == before[0] + 1
    assert sample("tenzro_worker_requests_total", door="peer", method="other",
                  outcome="method_not_found") == before[1] + 1


def test_http_requests_are_counted_by_kind_of_route() -> None:
    assert [route_kind(p) for p in ("/rpc", "/api/moe/receipts", "/peer/moe/execute", "/blobs/ab", "/metrics",
                                    "/network/", "/")] == ["rpc", "api", "peer", "blobs", "metrics", "dashboard",
                                                            "dashboard"]


_CHILD = """
import sys
from core import metrics
metrics.FORWARD_BATCHES.labels("quic").inc(int(sys.argv[1]))
metrics.TIER_BYTES.labels("warm").set(int(sys.argv[1]) * 1000)
print(__import__("os").getpid())
"""


def test_multiprocess_mode_adds_up_every_process_and_drops_a_dead_ones_gauges(tmp_path, monkeypatch) -> None:
    """What the node does: each child writes its own files under PROMETHEUS_MULTIPROC_DIR (emptied at
    start by the supervisor), the web process's /metrics reads them all; a dead child's live
    gauges are dropped, its counters kept."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_999999.db").write_bytes(b"left by a previous run")
    _empty_metrics_dir(directory)
    assert list(directory.iterdir()) == [] and oct(directory.stat().st_mode & 0o777) == "0o700"
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    pids = [int(subprocess.run([sys.executable, "-c", _CHILD, str(n)], env=env, capture_output=True, text=True,
                               check=True).stdout) for n in (2, 5)]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    registry = metrics_registry()
    assert registry is not REGISTRY
    assert registry.get_sample_value("tenzro_forward_batches_total", {"transport": "quic"}) == 7
    assert registry.get_sample_value("tenzro_tier_bytes", {"tier": "warm"}) == 7000
    _metrics_process_dead(directory, pids[0])
    registry = metrics_registry()
    assert registry.get_sample_value("tenzro_forward_batches_total", {"transport": "quic"}) == 7
    assert registry.get_sample_value("tenzro_tier_bytes", {"tier": "warm"}) == 5000


def test_tier_gauges_follow_the_published_status() -> None:
    status = {"experts": [{"memory_bytes": 100, "disk_bytes": 120, "residency": "Warm"},
                          {"memory_bytes": 0, "disk_bytes": 70, "residency": "Cold"}],
              "memory_used_bytes": 100 + 4000, "memory_budget_bytes": 10_000}
    assert _tier_gauges(status) is status
    assert [sample("tenzro_tier_bytes", tier=t) for t in ("warm", "cold", "reserved", "budget")] == [
        100, 70, 4000, 10_000]
