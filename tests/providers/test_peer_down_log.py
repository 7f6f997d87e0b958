"""A peer that stops answering gossip is logged once when it goes (WARNING) and once when it is back
(INFO), and costs a round one gossip interval at most."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import socket
import threading
import time

import pytest

from apps.node.selectors import redis_client
from apps.providers.rounds import (
    DOWN_KEY,
    PeerTarget,
    _peer_answered,
    _peer_failed,
    _push,
    peer_call,
    round_call_timeout_s,
)
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


class _AnswersOnceThenHangs(http.server.BaseHTTPRequestHandler):
    """A peer's HTTP door that answers the first push with a want, then never answers again."""

    calls = 0

    def do_POST(self) -> None:
        type(self).calls += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).calls > 1:
            time.sleep(30)
            return
        body = json.dumps({"ok": True, "result": {"want": ["ef" * 32]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.django_db(transaction=True, serialized_rollback=True)  # a thread writes (to_thread)
def test_a_peer_slow_on_its_second_call_holds_the_round_no_longer_than_its_deadline() -> None:
    """A push answered with a want is followed by a second call: both share the round's one deadline
    (each used to get a whole timeout, and a round lasted two, past a live peer's TTL of this node)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersOnceThenHangs)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slow = PeerTarget("ef" * 32, "ef" * 32, None, None, f"http://127.0.0.1:{server.server_address[1]}")
    try:
        started = time.monotonic()
        asyncio.run(_push([slow], {"records": []}, deadline=started + 1.5))
        took = time.monotonic() - started
    finally:
        server.shutdown()
        down = redis_client().srem(DOWN_KEY, slow.key)
    assert _AnswersOnceThenHangs.calls == 2
    assert took < 2.5, took  # the second call got what was left of 1.5 s, not a timeout of its own
    assert down  # and the peer counts as not answering
