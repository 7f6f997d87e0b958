"""Counts every HTTP request of the web process (tenzro_http_requests_total) by kind of route
and status class: one counter increment per request, labels from a closed set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from core import metrics

# Path prefixes and the kind each counts as; anything else is a dashboard page.
_KINDS = (("/rpc", "rpc"), ("/api/", "api"), ("/peer/", "peer"), ("/blobs/", "blobs"), ("/admin/", "admin"),
          ("/static/", "static"), ("/metrics", "metrics"), ("/accounts/", "accounts"))


def route_kind(path: str) -> str:
    for prefix, kind in _KINDS:
        if path.startswith(prefix):
            return kind
    return "dashboard"


def _count(path: str, status: int) -> None:
    metrics.HTTP_REQUESTS.labels(route_kind(path), f"{status // 100}xx").inc()


def serve_both_kinds(middleware: Any, get_response: Callable[[Any], Any]) -> None:
    """Make `middleware` (sync_capable and async_capable) take the kind of its chain: a coroutine
    function when get_response is one, so Django puts no thread hop on either side of it."""
    middleware.is_async = iscoroutinefunction(get_response)
    if middleware.is_async:
        markcoroutinefunction(middleware)


class RequestMetricsMiddleware:
    """Sync and async capable, so it never forces the other kind of view through a thread hop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        serve_both_kinds(self, get_response)

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self._acall(request)
        response = self.get_response(request)
        _count(request.path, response.status_code)
        return response

    async def _acall(self, request: Any) -> Any:
        response = await self.get_response(request)
        _count(request.path, response.status_code)
        return response


