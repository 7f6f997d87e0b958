"""A peer that stops answering gossip is logged once when it goes (WARNING) and once when it is back
(INFO), and costs a round one gossip interval at most."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest

from apps.node.selectors import redis_client
from apps.providers.rounds import DOWN_KEY, PeerTarget, _peer_answered, _peer_failed, peer_call, round_call_timeout_s
from core.transport.quic import TransportError


@pytest.fixture
def target():
    redis_client().delete(DOWN_KEY)
    yield PeerTarget("ab" * 32, "ab" * 32, "127.0.0.1:9", "0" * 64, "http://127.0.0.1:9")
    redis_client().delete(DOWN_KEY)


def test_a_peer_going_down_and_coming_back_is_said_once_each(target, caplog) -> None:
    down = TransportError("unreachable", "connection refused")
    with caplog.at_level(logging.DEBUG, logger="apps.providers.rounds"):
        _peer_answered(target)  # up all along: nothing to say
        for what in ("gossip push", "gossip sync", "gossip push"):
            _peer_failed(target, what, down)
        _peer_answered(target)
        _peer_answered(target)
    said = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records if r.name == "apps.providers.rounds"]
    peer = target.key[:24]
    assert said == [("WARNING", f"peer {peer} does not answer"),
                    ("DEBUG", f"gossip sync to {peer} failed again: connection refused"),
                    ("DEBUG", f"gossip push to {peer} failed again: connection refused"),
                    ("INFO", f"peer {peer} answers again")]


def test_a_peer_that_answers_nothing_costs_a_round_one_interval_at_most(settings) -> None:
    """QUIC datagrams into a socket nobody reads, HTTP into a listener that never answers: the call
    gives up after the round's timeout (QUIC and HTTP together), not 10 s for each."""
    settings.TENZRO_GOSSIP_INTERVAL_S = 1
    assert round_call_timeout_s() == 5.0  # at least 5 s
    settings.TENZRO_GOSSIP_INTERVAL_S = 60
    assert round_call_timeout_s() == 10.0  # at most the plain call's timeout
    settings.TENZRO_GOSSIP_INTERVAL_S = 6
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, socket.socket() as tcp:
        udp.bind(("127.0.0.1", 0))
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        deaf = PeerTarget("cd" * 32, "cd" * 32, f"127.0.0.1:{udp.getsockname()[1]}", "0" * 64,
                          f"http://127.0.0.1:{tcp.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(TransportError) as info:
            asyncio.run(peer_call(deaf, "gossip/push", {}, timeout_s=round_call_timeout_s()))
        took = time.monotonic() - started
    assert info.value.reason == "unreachable" and "quic" in str(info.value) and "http" in str(info.value)
    assert 6.0 <= took < 7.5, took  # the deadline is kept: both legs within the one timeout
