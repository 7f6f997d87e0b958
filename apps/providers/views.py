"""The HTTP fallback of the peer door: `POST /peer/<method>` for the gossip methods.

For peers that cannot reach this node over QUIC. Body `{"params": {...}}`; answer `{"ok": true,
"result": ...}` or `{"ok": false, "error": {"reason", "message"}}` with the error's HTTP status.
Open to anyone, like the QUIC door: it serves only what any peer may ask, within the same
per-peer limits (apps/worker/peer_limits.py).
"""

from __future__ import annotations

import orjson
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.views.decorators.csrf import csrf_exempt

from apps.providers.peer_methods import PEER_METHODS
from apps.worker.peer_limits import HttpPeerSlot
from core.errors import NotFound, RateLimited, TenzroError


def _answer(payload: dict, status: int = 200) -> HttpResponse:
    return HttpResponse(orjson.dumps(payload), status=status, content_type="application/json")


@csrf_exempt
async def peer_method(request: HttpRequest, method: str) -> HttpResponse:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        func = PEER_METHODS.get(method)
        if func is None:
            raise NotFound(f"no peer method {method!r} over HTTP", reason="method_not_found")
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError as exc:
            raise TenzroError(f"body is not JSON: {exc}", reason="bad_request") from exc
        params = body.get("params", {}) if isinstance(body, dict) else None
        if not isinstance(params, dict):
            raise TenzroError('body must be {"params": {...}}', reason="bad_request")
        async with HttpPeerSlot(request.META.get("REMOTE_ADDR")) as refusal:
            if refusal is not None:
                raise RateLimited(refusal.message, reason=refusal.reason)
            result = await func(params, peer_host=request.META.get("REMOTE_ADDR"))
    except TenzroError as exc:
        return _answer({"ok": False, "error": {"reason": exc.reason, "message": exc.message}}, exc.http_status)
    return _answer({"ok": True, "result": result})
