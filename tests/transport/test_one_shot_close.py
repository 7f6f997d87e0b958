"""A call on a connection of its own (a dial-back, a blob fetch, a dispute's verifier) returns with its
answer: the connection's CONNECTION_CLOSE goes out at once, and its closing period (three PTOs, RFC 9000
section 10.2) is waited out in the background, where it used to hold the caller ~90 ms on loopback."""

import asyncio
import gc
import warnings

import pytest

from core.transport.loop_thread import LoopThread
from core.transport.quic import QuicSettings, quic_call
from core.transport.quic_client import closing_count
from tests.transport.test_pool import Server

pytestmark = pytest.mark.parametrize("library", ["qh3", "aioquic"])


def _one_shot(server: Server, library: str, n: int):
    return quic_call(host="127.0.0.1", port=server.port, pin_sha256=server.identity.cert_sha256, method="echo",
                     params={"n": n}, settings=QuicSettings(max_body=1 << 20, library=library), timeout_s=10)


def test_a_one_shot_call_returns_while_its_connection_waits_out_the_closing_period(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        try:
            answers, closing_after = [], []
            for n in range(3):
                answers.append((await _one_shot(server, library, n))[0])
                closing_after.append(closing_count())
            for _ in range(200):  # then each one ends by itself
                if closing_count() == 0:
                    break
                await asyncio.sleep(0.02)
            return answers, closing_after, closing_count()
        finally:
            server.stop()

    answers, closing_after, left = asyncio.run(scenario())
    assert answers == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert closing_after[0] >= 1 and closing_after[-1] >= 1  # answered before the closing period ended
    assert left == 0


def test_a_loop_ending_mid_closing_period_still_closes_the_socket(identity, library) -> None:
    """asyncio.run (the dispute verifier's call) ends with the closing still pending: it is cancelled,
    and the socket is closed rather than left to the garbage collector."""
    host = LoopThread("test-server")
    server = host.run(Server(identity, library).start(), timeout_s=10)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            result, _ = asyncio.run(_one_shot(server, library, 7))
            gc.collect()
        assert result == {"n": 7}
        assert not [w for w in seen if issubclass(w.category, ResourceWarning)], [str(w.message) for w in seen]
    finally:
        host.run(_stop(server), timeout_s=5)
        host.stop()


async def _stop(server: Server) -> None:
    server.stop()
