"""The shard map page (/shardmap/) and the dispatch plan page (/dispatch/).

Thin edges: parse the request, read through selectors_shards / the planner, render. Planning
changes nothing, and generating routings only runs the node's gate over random rows, so both
pages are open to whoever may see the dashboard (dashboard_page); the POST carries CSRF.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from pydantic import ValidationError

from apps.dashboard import selectors_shards
from apps.dashboard.access import dashboard_page
from apps.providers.api import PlanParams
from apps.providers.selectors import shard_index_seen
from apps.worker import client as worker_client
from apps.worker.selectors import gate_d_model
from core.errors import TenzroError
from core.shardmap.planner import plan_dispatch
from core.shardmap.routings import PlanInputError

MAX_GENERATED_TOKENS = 4096
MAX_D_MODEL = 1 << 16
ASSIGNMENTS_SHOWN = 200
MAX_UPLOAD_BYTES = 8 << 20


def _model(request: HttpRequest, models: list[str]) -> str:
    return request.GET.get("model") or (models[0] if models else "")


def _int(request: HttpRequest, name: str, *, low: int = 0, high: int = (1 << 31) - 1) -> int | None:
    try:
        value = int(request.GET.get(name, ""))
    except ValueError:
        return None
    return value if low <= value <= high else None


@dashboard_page
def shardmap(request: HttpRequest) -> HttpResponse:
    models = selectors_shards.shardmap_models()
    model_id = _model(request, models)
    grid = selectors_shards.shardmap_grid(model_id=model_id) if model_id else None
    return render(request, "dashboard/shardmap.html", {"models": models, "model_id": model_id, "grid": grid})


@dashboard_page
def shardmap_data(request: HttpRequest) -> JsonResponse:
    """The page's heatmap data (refetched when a shardmap.changed event names its model)."""
    model_id = request.GET.get("model", "")
    if not model_id:
        return JsonResponse({"error": "model is required"}, status=400)
    return JsonResponse(selectors_shards.shardmap_grid(model_id=model_id))


@dashboard_page
def shardmap_cell(request: HttpRequest) -> JsonResponse:
    """One cell's holders (residency, committed_tps, blob_uri, reputation), on click."""
    model_id, layer, expert = request.GET.get("model", ""), _int(request, "layer"), _int(request, "expert")
    if not model_id or layer is None or expert is None:
        return JsonResponse({"error": "model, layer and expert are required"}, status=400)
    return JsonResponse(selectors_shards.shardmap_cell(model_id=model_id, layer=layer, expert=expert))


def _routings_from(request: HttpRequest) -> Any:
    """Pasted or uploaded routings JSON (an upload wins). Raises ValueError with a readable reason."""
    upload = request.FILES.get("routings_file")
    if upload is not None:
        if upload.size > MAX_UPLOAD_BYTES:
            raise ValueError(f"the file is larger than {MAX_UPLOAD_BYTES >> 20} MiB")
        text = upload.read().decode("utf-8", errors="replace")
    else:
        text = request.POST.get("routings", "")
    if not text.strip():
        raise ValueError("paste routings JSON or choose a file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc


def _generate(model_id: str, post: Any) -> list[dict[str, Any]]:
    """Random hidden states (seeded) through this node's gate for the layer (tenzro_moeRoute)."""
    try:
        layer, d_model = int(post.get("layer") or 0), int(post.get("d_model") or 0)
        tokens, seed = int(post.get("tokens") or 16), int(post.get("seed") or 0)
    except ValueError as exc:
        raise ValueError("layer, d_model, tokens and seed must be integers") from exc
    if not d_model:  # left empty: the width of the gate this node holds for the layer
        d_model = gate_d_model(model_id, layer) or 0
        if not d_model:
            raise ValueError(f"this node holds no gate for {model_id} layer {layer}: load one, or give d_model")
    if not (0 <= layer < 1 << 31 and 0 < d_model <= MAX_D_MODEL and 0 < tokens <= MAX_GENERATED_TOKENS):
        raise ValueError(f"need 0 <= layer, 0 < d_model <= {MAX_D_MODEL}, 0 < tokens <= {MAX_GENERATED_TOKENS}")
    hidden = np.random.default_rng(seed).standard_normal((tokens, d_model)).astype("<f4")  # (tokens, d_model)
    try:
        routed = async_to_sync(worker_client.route)(model_id=model_id, layer=layer, d_model=d_model,
                                                    rows=hidden.tobytes())
    except TenzroError as exc:
        raise ValueError(f"the gate could not route: {exc}") from exc
    return [{"token_index": r["token_index"], "experts": [{"layer": e["layer"], "expert": e["expert"]}
                                                          for e in r["experts"]]} for r in routed["routings"]]


def _plan(model_id: str, routings: Any, allow_cold: bool) -> dict[str, Any]:
    try:  # the API's own schema: the same limits and messages as tenzro_moePlanDispatch
        params = PlanParams.model_validate({"model_id": model_id, "routings": routings, "allow_cold": allow_cold})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"routings: {'.'.join(map(str, first['loc']))}: {first['msg']}") from exc
    clean = [r.model_dump() for r in params.routings]
    try:
        return plan_dispatch(clean, shard_index_seen(model_id)[0], allow_cold=allow_cold)
    except PlanInputError as exc:
        raise ValueError(str(exc)) from exc


@dashboard_page
def dispatch(request: HttpRequest) -> HttpResponse:
    models = selectors_shards.shardmap_models()
    context: dict[str, Any] = {"models": models, "model_id": _model(request, models), "form": request.POST,
                               "error": None, "plan": None,
                               "routings_text": request.POST.get("routings", "")}
    if request.method == "POST":
        model_id = request.POST.get("model_id", "").strip()
        context["model_id"] = model_id
        try:
            if not model_id:
                raise ValueError("choose a model")
            generated = request.POST.get("action") == "generate"
            routings = _generate(model_id, request.POST) if generated else _routings_from(request)
            plan = _plan(model_id, routings, request.POST.get("allow_cold") == "on")
            context.update(plan=plan, summary=_summary(plan), generated=generated,
                           routings_text=json.dumps(routings) if generated else context["routings_text"],
                           assignments=plan["token_assignments"][:ASSIGNMENTS_SHOWN])
        except ValueError as exc:
            context["error"] = str(exc)
    return render(request, "dashboard/dispatch.html", context, status=400 if context["error"] else 200)


def _summary(plan: dict[str, Any]) -> dict[str, Any]:
    """Tokens per holder (rows it would run, over all its batches), largest first, for the chart."""
    per_holder: Counter[str] = Counter()
    batches: Counter[str] = Counter()
    for b in plan["batches"]:
        per_holder[b["provider"]] += len(b["token_indices"])
        batches[b["provider"]] += 1
    bars = [{"provider": p, "tokens": n, "batches": batches[p]}
            for p, n in sorted(per_holder.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {"bars": bars, "tokens": len(plan["token_assignments"]), "batches": len(plan["batches"]),
            "unroutable": len(plan["unroutable"])}
