"""ASGI middleware: an HTTP request body over TENZRO_RPC_MAX_BYTES is refused with 413 before it is read.

Django's ASGI handler reads the whole body (spooling it to a temp file past
FILE_UPLOAD_MAX_MEMORY_SIZE) before a view can look at its size, and uvicorn has no body
limit: a client could make the web process write gigabytes to disk just to be told 413.
This middleware answers 413 at once when Content-Length announces too much, and stops
reading a body without one (chunked) as soon as it passes the limit: the app is told the
client left (Django then answers nothing) and the 413 is sent here.

The 413 has the shape of the route's errors (docs/protocol.md): a JSON-RPC error at /rpc, a
response frame at /peer/moe/execute, else the REST `{"detail", "reason", …}` object; each
carries reason `payload_too_large`, `limit_bytes` and `setting`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from core.errors import PayloadTooLarge
from core.transport.framing import FRAME_CONTENT_TYPE, Reply

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

SETTING = "TENZRO_RPC_MAX_BYTES"


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server (h11/httptools) refuses these before we see them
    return None


def too_large_answer(path: str, limit: int, *, announced: int | None) -> tuple[str, bytes]:
    """(content type, body) of the 413 for a request to `path`."""
    size = f"{announced} bytes" if announced is not None else "more"
    exc = PayloadTooLarge(f"request body of {size} exceeds {SETTING} ({limit} bytes)", limit_bytes=limit,
                          setting=SETTING)
    if path == "/rpc":
        error = {"code": exc.code, "message": exc.message, "data": exc.data()}
        return "application/json", orjson.dumps({"jsonrpc": "2.0", "error": error, "id": None})
    if path.startswith("/peer/moe/"):
        return FRAME_CONTENT_TYPE, Reply.error(exc.reason, exc.message, exc.details).encode()
    return "application/json", orjson.dumps({"detail": exc.message, **exc.data()})


class BodyLimit:
    """Wrap an ASGI app so no HTTP request body over `limit` bytes reaches it."""

    def __init__(self, app: App, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        announced = _content_length(scope)
        if announced is not None and announced > self.limit:
            await self._refuse(scope, send, announced=announced)
            return
        seen = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    over = True  # the app reads this as the client gone, and answers nothing
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, tracking_send)
        if over and not started:
            await self._refuse(scope, send, announced=None)

    async def _refuse(self, scope: Scope, send: Send, *, announced: int | None) -> None:
        content_type, body = too_large_answer(scope.get("path", ""), self.limit, announced=announced)
        # Connection: close, so the server does not try to read the unread rest of the body
        # as the next request on this connection.
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
