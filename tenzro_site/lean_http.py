"""Django for machines: the routes whose clients are programs (the OpenAI-compatible API under /v1)
run without the browser's middleware.

Under ASGI every middleware built on Django's MiddlewareMixin (sessions, CSRF, authentication,
messages, frame options, common, security) runs its hooks through a thread hop, ~0.3 ms each and
more when the machine is busy: ~2.5 ms before a /v1 request reaches its view, where the API's whole
budget over a generation's time to first token is 5 ms (docs/performance.md). A /v1 request carries
a client key, never a session or a CSRF token, and its answers are JSON or server-sent events that
no browser renders as a page (the security middleware's headers are for pages: this node sets no
SECURE_* redirect or HSTS; TLS in front of /v1 is the proxy's), so it keeps only the request counter."""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.test.utils import override_settings

# What a program's request goes through, in settings.MIDDLEWARE's order.
LEAN_MIDDLEWARE = ("apps.api.metrics_middleware.RequestMetricsMiddleware",)
LEAN_PREFIXES = ("/v1/",)


class LeanASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        # Django builds its chain from settings.MIDDLEWARE; this handler's chain is built once, at start.
        with override_settings(MIDDLEWARE=list(LEAN_MIDDLEWARE)):
            super().load_middleware(is_async)


class ByPath:
    """An ASGI app: HTTP requests under LEAN_PREFIXES go to `lean`, everything else to `full`."""

    def __init__(self, full: Any, lean: Any) -> None:
        self.full, self.lean = full, lean

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        app = self.lean if scope["type"] == "http" and path.startswith(LEAN_PREFIXES) else self.full
        await app(scope, receive, send)
