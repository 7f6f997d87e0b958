"""The network and runtime pages: server-rendered first paint, then live over the websocket (live.js)."""

from __future__ import annotations

import time

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.dashboard.access import dashboard_page
from apps.providers.selectors import provider_rows
from apps.worker.selectors import worker_status_published

# A network.changed push names at most this many ids; more is a whole-view refresh anyway.
MAX_IDS_PER_FETCH = 200


def _network_context(provider_ids: list[str] | None = None) -> dict:
    now_ms = int(time.time() * 1000)
    return {"providers": provider_rows(provider_ids, now_ms=now_ms), "now_ms": now_ms,
            "ttl_s": settings.TENZRO_GOSSIP_TTL_S, "heartbeat_s": settings.TENZRO_GOSSIP_HEARTBEAT_S,
            "suspect_after_s": 2 * settings.TENZRO_GOSSIP_HEARTBEAT_S}


@dashboard_page
def network(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/network.html", _network_context())


@dashboard_page
def network_rows(request: HttpRequest) -> HttpResponse:
    """The rows of the providers named in ?ids=a,b (all of them without ?ids): what network.js
    fetches after a network.changed push. Ids not in the view come back as no row."""
    raw = request.GET.get("ids")
    ids = None if raw is None else [i for i in raw.split(",") if i][:MAX_IDS_PER_FETCH]
    return render(request, "dashboard/_network_rows.html", _network_context(ids))


@dashboard_page
def runtime(request: HttpRequest) -> HttpResponse:
    status = worker_status_published()
    budget = status["memory_budget_bytes"]
    active = [c["reason"] for c in status["compute"]["candidates"] if c["active"]]
    context = {"status": status, "used_pct": round(100 * status["memory_used_bytes"] / budget, 1) if budget else 0,
               "backend_reason": active[0] if active else None, "device": status["compute"]["device"]}
    return render(request, "dashboard/runtime.html", context)
