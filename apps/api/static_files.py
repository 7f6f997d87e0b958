"""WhiteNoise's static files, served from an async middleware chain without a thread hop.

WhiteNoiseMiddleware is sync only: under ASGI, Django then runs every async view through two thread
hops around it (async to sync and back), ~2 ms a request. Finding a static file is a dict lookup
(a stat under autorefresh), so the async path does the same as the sync one without the hops."""

from __future__ import annotations

from typing import Any

from whitenoise.middleware import WhiteNoiseMiddleware

from apps.api.metrics_middleware import serve_both_kinds


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any = None) -> None:
        super().__init__(get_response)
        serve_both_kinds(self, get_response)

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request: Any) -> Any:
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is not None:
            return self.serve(static_file, request)
        return await self.get_response(request)
