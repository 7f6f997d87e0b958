"""`GET /metrics`: the node's Prometheus metrics (core/metrics.py), in the exposition format.

Open by default, like the node's other reads (TENZRO_METRICS_PUBLIC=1); with 0 it needs the
operator token (Authorization: Bearer …), which Prometheus sends with `authorization:
credentials_file:` (docs/operations.md, "Metrics").
"""

from __future__ import annotations

import os

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from apps.api.auth import bearer_token, is_operator


def metrics_registry() -> CollectorRegistry:
    """Every process's metrics when the node runs them in multiprocess mode, else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


def metrics_endpoint(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    if not settings.TENZRO_METRICS_PUBLIC and not is_operator(bearer_token(request.headers.get("Authorization"))):
        return HttpResponse("metrics need the operator token (Authorization: Bearer …)\n", status=401,
                            content_type="text/plain", headers={"WWW-Authenticate": "Bearer"})
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
