"""Gossip calls keep one QUIC connection per peer from round to round (apps/providers/rounds.py), and
a peer that restarted under a kept connection is reconnected to at once, not after the call's timeout."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from apps.node.identity import load_or_create_identity
from apps.providers import rounds
from apps.providers.rounds import PeerTarget, peer_call
from core.transport.framing import Reply
from core.transport.loop_thread import LoopThread
from core.transport.pool import QuicPool
from core.transport.quic import PeerRequest, QuicSettings, start_server
from testkit.nodes import free_port


class GossipPeer:
    """A peer's QUIC door answering gossip pushes, on a loop of its own (another process's, in effect)."""

    def __init__(self, identity, port: int) -> None:
        self.identity, self.port, self.pushes = identity, port, 0
        self.runner = LoopThread(f"peer-{port}")
        self._server = None

    async def _handle(self, request: PeerRequest) -> Reply:
        self.pushes += 1
        return Reply.ok({"want": []})

    def start(self) -> GossipPeer:
        async def start() -> None:
            self._server = await start_server(host="127.0.0.1", port=self.port, cert_path=str(self.identity.cert_path),
                                              key_path=str(self.identity.cert_key_path), handler=self._handle,
                                              settings=QuicSettings(max_body=1 << 20))

        self.runner.run(start(), timeout_s=10)
        return self

    def crash(self) -> None:
        """Gone without a CONNECTION_CLOSE, as a killed process is."""
        async def crash() -> None:
            self._server._transport.close()
            await asyncio.sleep(0.1)

        self.runner.run(crash(), timeout_s=5)
        self.runner.stop()


@pytest.fixture
def rounds_loop():
    runner = LoopThread("gossip-rounds-test")
    pool = QuicPool(QuicSettings(max_body=1 << 20))

    def call(target: PeerTarget, timeout_s: float = 8.0) -> tuple[dict, float]:
        async def on_the_rounds_loop() -> dict:
            rounds._POOL.set(pool)  # as rounds._pooled_round sets it for a round
            return await peer_call(target, "gossip/push", {"records": []}, timeout_s=timeout_s)

        started = time.monotonic()
        return runner.run(on_the_rounds_loop(), timeout_s=30), time.monotonic() - started

    yield call, pool
    runner.run(pool.close(), timeout_s=10)
    runner.stop()


def test_calls_to_a_peer_share_one_connection_and_a_restarted_peer_is_redialed_at_once(rounds_loop, tmp_path):
    call, pool = rounds_loop
    identity = load_or_create_identity(tmp_path / "peer")  # the restarted peer keeps its data dir: same pin
    port = free_port(socket.SOCK_DGRAM)
    peer = GossipPeer(identity, port).start()
    target = PeerTarget("ab" * 32, None, f"127.0.0.1:{port}", identity.cert_sha256, None)  # QUIC only
    try:
        for _ in range(3):
            assert call(target)[0] == {"want": []}
        assert pool.stats()["handshakes"] == 1 and peer.pushes == 3

        peer.crash()
        peer = GossipPeer(identity, port).start()
        answer, took = call(target)
        # the PING on the kept connection went unanswered for 1 s (ROUND_TRIP_TIMEOUT_S), so the call
        # reconnected rather than waiting out its 8 s on a connection the new process does not know
        assert answer == {"want": []} and took < 4.0, took
        assert pool.stats()["handshakes"] == 2 and pool.stats()["reconnects"] == 1 and peer.pushes == 1
    finally:
        peer.runner.stop()
