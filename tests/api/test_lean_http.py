"""/v1's programs skip the browser's middleware (tenzro_site/lean_http.py); pages keep it all."""

import asyncio

import pytest
from asgiref.testing import ApplicationCommunicator

from tenzro_site.asgi import application

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def _get(path: str) -> tuple[int, dict[bytes, bytes]]:
    async def scenario():
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        app = ApplicationCommunicator(application, scope)
        await app.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await app.receive_output(10)
        while (await app.receive_output(10)).get("more_body"):
            pass
        return start["status"], dict(start["headers"])

    return asyncio.run(scenario())


def test_v1_runs_without_the_browsers_middleware_and_pages_keep_it() -> None:
    status, headers = _get("/v1/models")  # no key: refused by /v1's own door, in OpenAI's shape
    assert status == 401
    assert b"X-Frame-Options" not in headers and b"Vary" not in headers  # no frame options, no session or CSRF
    status, headers = _get("/accounts/login/")
    assert status == 200 and headers[b"X-Frame-Options"] == b"DENY"
