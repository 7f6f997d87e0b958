"""ASGI entry point: Django for HTTP, Channels for the dashboard websockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tenzro_site.settings.base")

# Django must be set up before anything imports models (the consumers do).
django_http = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from apps.api.body_limit import BodyLimit  # noqa: E402
from apps.dashboard.routing import websocket_urlpatterns  # noqa: E402
from tenzro_site.lean_http import ByPath, LeanASGIHandler  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Bodies over TENZRO_RPC_MAX_BYTES are refused (413) before Django reads them.
        # /v1's programs skip the browser's middleware (tenzro_site/lean_http.py).
        "http": BodyLimit(ByPath(django_http, LeanASGIHandler()), limit=settings.TENZRO_RPC_MAX_BYTES),
        "websocket": AllowedHostsOriginValidator(URLRouter(websocket_urlpatterns)),
    }
)
