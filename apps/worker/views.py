"""The HTTP fallback of the peer door for binary methods: `POST /peer/moe/execute`, `POST /peer/receipt/verify`.

For peers that cannot reach this node over QUIC. The body is exactly the request frame a
QUIC stream would carry (docs/protocol.md, "Frames": a 16-byte prefix, a JSON header, raw
rows), with content type application/x-tenzro-frame; the answer is the response frame, with
the error's HTTP status when it is one. Rows stay raw bytes end to end: no base64, no JSON
body (JSON clients use `tenzro_moeExecute`, which takes the base64 rows of docs/specification.md). The worker
serves the call through its peer door, so only what any peer may ask gets through, within
the peer door's per-peer limits (apps/worker/peer_limits.py).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.views.decorators.csrf import csrf_exempt

from apps.worker.client import worker_call
from apps.worker.peer_limits import HttpPeerSlot
from core.errors import REASONS, TenzroError
from core.transport.framing import FRAME_CONTENT_TYPE, KIND_REQUEST, FramingError, Reply, decode_frame


def _answer(reply: Reply) -> HttpResponse:
    error = reply.header.get("error")
    status = 200 if error is None else REASONS.get(error["reason"], TenzroError)._http_status
    return HttpResponse(reply.encode(), status=status, content_type=FRAME_CONTENT_TYPE)


@csrf_exempt
async def peer_frame(request: HttpRequest, method: str) -> HttpResponse:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if request.content_type != FRAME_CONTENT_TYPE:
        return _answer(Reply.error("bad_request", f"send one request frame as {FRAME_CONTENT_TYPE}, "
                                                  f"not {request.content_type or 'no content type'}"))
    try:
        frame = decode_frame(request.body, kind=KIND_REQUEST, max_body=settings.TENZRO_PEER_MAX_BODY_BYTES,
                             body_setting="TENZRO_PEER_MAX_BODY_BYTES")
    except FramingError as exc:
        return _answer(Reply.error(exc.reason, str(exc), exc.details))
    header = frame.header
    if header.get("method") != method or not isinstance(header.get("params"), dict):
        return _answer(Reply.error("bad_request", f"this route serves {method}; the frame's header must be "
                                                  f'{{"method": "{method}", "params": {{...}}}}'))
    async with HttpPeerSlot(request.META.get("REMOTE_ADDR")) as refusal:
        if refusal is not None:
            return _answer(Reply.error(refusal.reason, refusal.message))
        try:
            result, body = await worker_call(method, header["params"], body=bytes(frame.body), door="peer",
                                             peer=request.META.get("REMOTE_ADDR"))
        except TenzroError as exc:
            return _answer(Reply.error(exc.reason, exc.message, exc.details))
    return _answer(Reply.ok(result, body))
