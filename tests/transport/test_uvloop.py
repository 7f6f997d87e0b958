"""QUIC on uvloop: the web process's event loop is uvloop (uvicorn picks it where it is installed, and
requirements.txt installs it), and the web process makes QUIC calls of its own (a dial-back through
the HTTP peer door, apps/providers/peer_methods.py). The libraries' UDP transports read their sockets
with loop.add_reader, which uvloop implements: these tests run a server and both kinds of call on it."""

import asyncio

import pytest

from core.transport.quic import QuicSettings, quic_call
from tests.transport.test_pool import Server, _call, _pool

uvloop = pytest.importorskip("uvloop")
pytestmark = pytest.mark.parametrize("library", ["qh3", "aioquic"])


def test_a_pooled_call_and_a_one_shot_call_work_on_uvloop(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            pooled, body = await _call(pool, server, params={"n": 1}, body=b"x" * 300_000)
            once, _ = await quic_call(host="127.0.0.1", port=server.port, pin_sha256=server.identity.cert_sha256,
                                      method="echo", params={"n": 2},
                                      settings=QuicSettings(max_body=1 << 20, library=library), timeout_s=10)
            return pooled, len(body), once, type(asyncio.get_running_loop()).__module__
        finally:
            await pool.close()
            server.stop()

    pooled, size, once, loop_module = uvloop.run(scenario())
    assert loop_module.startswith("uvloop")
    assert pooled == {"n": 1} and size == 300_000 and once == {"n": 2}
