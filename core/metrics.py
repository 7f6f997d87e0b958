"""The node's Prometheus metrics, in one place (docs/operations.md, "Metrics").

Plain module (prometheus_client only, no Django): the pure cores that count something (the
worker's method table, the QUIC server) import it like the Django parts do. Every process of
a node updates its own copies; `tenzro node run` gives each child the same
PROMETHEUS_MULTIPROC_DIR (under the data dir, emptied at start), so the web process's
`GET /metrics` adds up what the expert worker, the Celery worker and itself counted
(prometheus_client's multiprocess mode). Without that variable (a test, a shell) each process
keeps its own, and /metrics shows the web process's.

Updates are a counter increment or one histogram observation per forward, per request or per
record; nothing here runs per row or per byte. Label values come from closed sets (reasons,
transports, door names, known methods) or from what the operator loaded (model ids), never
from what a peer sends unchecked, so a peer cannot grow the label space.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from core.errors import REASONS

# Latency of whole forwards, from 5 ms (a local batch-1 layer) to a minute (a replanned one).
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

FORWARD_SECONDS = Histogram(
    "tenzro_forward_seconds", "Distributed forward of one layer on this router, by model and stage "
    "(plan: gate, readahead and the plan; dispatch: batches out to the combined rows; total)",
    ["model", "stage"], buckets=_SECONDS)
FORWARDS = Counter("tenzro_forwards", "Distributed forwards on this router, by outcome (ok, incomplete)",
                   ["outcome"])
FORWARD_BATCHES = Counter("tenzro_forward_batches", "Batches a forward dispatched and got answered, by transport "
                          "(local, quic, http)", ["transport"])
FORWARD_LANE_PARTS = Counter("tenzro_forward_lane_parts", "Parts of holders' requests that forwards split over "
                             "QUIC lanes (a request larger than its connection's congestion window on a lossy path)")
HOLDER_FAILURES = Counter("tenzro_holder_failures", "Failed attempts of a forward's batches, by reason", ["reason"])
RECEIPTS = Counter("tenzro_receipts", "Receipts: signed (as holder), verified and rejected (as router)", ["event"])
DISPUTES = Counter("tenzro_disputes", "Disputes: opened, upheld, dismissed", ["event"])
TIER_BYTES = Gauge("tenzro_tier_bytes", "Bytes of the expert runtime's tiers: warm (memory), cold (disk), "
                   "reserved (dense weights), budget", ["tier"], multiprocess_mode="livesum")
GOSSIP_RECORDS = Counter("tenzro_gossip_records", "Provider records and heartbeats received by gossip, by verdict "
                         "(accepted, duplicate, replayed, forged, expired, skewed, oversized, malformed)", ["verdict"])
WORKER_REQUESTS = Counter("tenzro_worker_requests", "Calls of the expert worker's methods by door (peer: QUIC and "
                          "its HTTP fallback; operator), method and outcome (ok or the error reason)",
                          ["door", "method", "outcome"])
PEER_REFUSED = Counter("tenzro_peer_refused", "Requests and connections the peer door refused, by door (quic, http) "
                       "and limit", ["door", "reason"])
HTTP_REQUESTS = Counter("tenzro_http_requests", "HTTP requests of the web process by kind of route and status class",
                        ["kind", "status"])
RPC_REQUESTS = Counter("tenzro_rpc_requests", "JSON-RPC calls by method and outcome (ok or the error reason)",
                       ["method", "outcome"])


def reason_label(reason: object) -> str:
    """`reason` when it is one of the node's documented error reasons (or a forward's `stalled`),
    else "other": a remote holder's or client's made-up reason never becomes a label."""
    return reason if isinstance(reason, str) and (reason in REASONS or reason == "stalled") else "other"
