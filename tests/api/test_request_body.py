"""A large JSON-RPC body is read into memory by the real ASGI handler, never spooled to disk."""

import asyncio
import base64
import json
import tempfile

import numpy as np
import pytest
from django.core.asgi import get_asgi_application
from django.core.handlers import asgi as django_asgi

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


class RecordingSpool(tempfile.SpooledTemporaryFile):
    made: list["RecordingSpool"] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        RecordingSpool.made.append(self)
        self.rolled_over = False

    def rollover(self):
        self.rolled_over = True
        super().rollover()


def test_an_8_mb_request_stays_in_memory(monkeypatch, settings) -> None:
    monkeypatch.setattr(django_asgi.tempfile, "SpooledTemporaryFile", RecordingSpool)
    rows = np.zeros((1024, 2048), dtype="<f4")  # 8 MiB of rows, 11 MB as base64 JSON
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_nodeInfo"}).encode()
    body += b" " * (len(base64.b64encode(rows.tobytes())) - len(body))  # JSON allows trailing spaces
    assert len(body) > 3 * 1024 * 1024 > 2_621_440  # well past Django's 2.5 MB default spool size
    app = get_asgi_application()
    sent: list[dict] = []
    chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)]

    async def receive():
        if chunks:
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
        await asyncio.sleep(3600)  # the client stays connected; Django stops listening once it answers

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/rpc", "headers": [(b"content-type", b"application/json"),
             (b"host", b"127.0.0.1")], "query_string": b"", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1),
             "scheme": "http", "http_version": "1.1", "asgi": {"version": "3.0"}, "root_path": ""}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    answer = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    assert status == 200 and "provider_id" in answer["result"]
    assert RecordingSpool.made and not any(spool.rolled_over for spool in RecordingSpool.made)
    assert settings.FILE_UPLOAD_MAX_MEMORY_SIZE == settings.TENZRO_RPC_MAX_BYTES
