"""A peer that stops answering gossip is logged once when it goes (WARNING) and once when it is back (INFO)."""

from __future__ import annotations

import logging

import pytest

from apps.node.selectors import redis_client
from apps.providers.rounds import DOWN_KEY, PeerTarget, _peer_answered, _peer_failed
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
