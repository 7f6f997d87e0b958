"""QuicPool.round_trip_s: a PING on the kept connection, and a kept connection the peer no longer knows
dropped by it (tests/transport/test_pool.py has the pool's calls)."""

import asyncio

import pytest

from core.transport.quic import TransportError
from tests.transport.test_pool import Server, _call, _pool

pytestmark = pytest.mark.parametrize("library", ["qh3", "aioquic"])


def _ping(pool, server: Server, timeout_s: float = 5.0):
    return pool.round_trip_s(host="127.0.0.1", port=server.port, pin_sha256=server.identity.cert_sha256,
                             timeout_s=timeout_s)


def test_a_ping_opens_or_reuses_the_peers_connection_and_measures_the_round_trip(identity, library) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            first = await _ping(pool, server)  # no connection yet: it is opened for the PING
            await _call(pool, server, params={"n": 1})
            second = await _ping(pool, server)
            return first, second, pool.stats()
        finally:
            await pool.close()
            server.stop()

    first, second, stats = asyncio.run(scenario())
    assert 0 < first < 5 and 0 < second < 5
    assert stats["handshakes"] == 1 and stats["open_connections"] == 1 and stats["calls"] == 1  # a PING is no call


async def _restarted(server: Server, pool, library: str) -> Server:
    """The peer crashed (no CONNECTION_CLOSE: the client is not told) and a new process serves its port,
    ignoring the old connection's packets."""
    server._server._transport.close()
    await asyncio.sleep(0.1)  # the socket closes on the loop's next turn
    return await Server(server.identity, library, port=server.port).start()


async def _closed_in_the_core(server: Server, pool, library: str) -> Server:
    """The library's core closed the connection (an idle timeout, a peer's error) and its event is not
    handled yet: the PING fails as closed, not with the library's own error."""
    (pooled,) = pool._pooled.values()
    pooled.connection.protocol._quic.close()  # the core's state only: nothing handled yet
    return server


@pytest.mark.parametrize(("dies", "reason"), [(_restarted, "timeout"), (_closed_in_the_core, "connection_closed")])
def test_a_kept_connection_that_died_is_dropped_by_the_ping_and_the_next_call_reconnects(
        identity, library, dies, reason) -> None:
    async def scenario():
        server = await Server(identity, library).start()
        pool = _pool(library)
        try:
            await _call(pool, server, params={"n": 1})
            server = await dies(server, pool, library)
            with pytest.raises(TransportError) as info:
                await _ping(pool, server, timeout_s=0.5)
            assert info.value.reason == reason
            assert pool.stats()["open_connections"] == 0  # dropped: the next call does not wait on it
            result, _ = await _call(pool, server, params={"n": 2})
            return result, pool.stats()
        finally:
            await pool.close()
            server.stop()

    result, stats = asyncio.run(scenario())
    assert result == {"n": 2} and stats["reconnects"] == 1 and stats["failures"] == 0


def test_a_ping_to_nobody_fails_within_its_time(identity, library) -> None:
    async def scenario():
        server = Server(identity, library)  # never started: its port answers nothing
        pool = _pool(library)
        try:
            with pytest.raises(TransportError) as info:
                await _ping(pool, server, timeout_s=0.3)
            return info.value.reason
        finally:
            await pool.close()

    assert asyncio.run(scenario()) in {"timeout", "connection_failed"}
