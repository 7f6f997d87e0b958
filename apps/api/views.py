"""The JSON-RPC endpoint: POST /rpc."""

from __future__ import annotations

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.views.decorators.csrf import csrf_exempt

from apps.api.auth import bearer_token, is_operator
from apps.api.errors import error_object
from apps.api.jsonrpc import handle_payload
from core.errors import PayloadTooLarge


@csrf_exempt
async def rpc_endpoint(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        body = request.body
    except RequestDataTooBig:
        exc = PayloadTooLarge(f"request body exceeds TENZRO_RPC_MAX_BYTES ({settings.TENZRO_RPC_MAX_BYTES} bytes)",
                              limit_bytes=settings.TENZRO_RPC_MAX_BYTES, setting="TENZRO_RPC_MAX_BYTES")
        payload = {"jsonrpc": "2.0", "error": error_object(exc.code, exc.message, exc.data()), "id": None}
        return HttpResponse(orjson.dumps(payload), status=exc.http_status, content_type="application/json")
    token = bearer_token(request.headers.get("Authorization"))
    answer = await handle_payload(body, operator=is_operator(token), token_sent=token is not None)
    if answer is None:
        return HttpResponse(status=204)
    # orjson writes a base64 row string ~4x faster than json.dumps. It would write NaN as null:
    # every result is validated against its schema first, which refuses non-finite floats.
    return HttpResponse(orjson.dumps(answer), content_type="application/json")
