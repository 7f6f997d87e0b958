"""A server's answers go out in batches: qh3's server runs on the UDP transport its client uses
(quinn-udp, GSO) instead of asyncio's endpoint, one system call per datagram (core/transport/quic_lib.py,
_serve_batched). Counted where the server's connections hand their datagrams to its transport."""

import asyncio
import dataclasses

import pytest

from core.transport.framing import Reply
from core.transport.pool import QuicPool
from core.transport.quic import PeerRequest, QuicSettings, start_server
from tests.transport.test_pool import _free_udp_port

DATAGRAM = 1452  # an Ethernet path's
ANSWER = bytes(range(256)) * 4096  # 1 MiB: ~720 datagrams of DATAGRAM bytes


async def _answer(request: PeerRequest) -> Reply:
    return Reply.ok({"n": request.params.get("n")}, ANSWER[: request.params["size"]])


async def _exchange(identity, library: str, size: int, *, batched: bool = True, before_calls=None):
    """One call for `size` bytes of ANSWER; (header, answer, the server's transport)."""
    port = _free_udp_port()
    settings = QuicSettings(max_body=1 << 24, library=library, max_datagram_size=DATAGRAM)
    server = await start_server(host="127.0.0.1", port=port, cert_path=str(identity.cert_path),
                                key_path=str(identity.cert_key_path), handler=_answer,
                                settings=dataclasses.replace(settings, batched_server=batched))
    if before_calls is not None:
        before_calls(server._transport)
    pool = QuicPool(settings)
    try:
        header, answer = await pool.call(host="127.0.0.1", port=port, pin_sha256=identity.cert_sha256, method="get",
                                         params={"n": 1, "size": size}, timeout_s=10)
        return header, bytes(answer), server._transport
    finally:
        await pool.close()
        server.close()


def test_a_large_answer_goes_out_in_batches_and_arrives_whole(identity, monkeypatch) -> None:
    sent = {"calls": 0, "datagrams": 0}

    def count_the_servers_sends(transport) -> None:  # before any connection takes the bound method
        send = type(transport).sendto_many

        def counting(self, datagrams, addr=None):
            if self is transport:  # the client's transport is of the same class: not counted
                sent["calls"] += 1
                sent["datagrams"] += len(datagrams)
            return send(self, datagrams, addr)

        monkeypatch.setattr(type(transport), "sendto_many", counting)

    header, answer, _ = asyncio.run(_exchange(identity, "qh3", len(ANSWER), before_calls=count_the_servers_sends))
    assert header == {"n": 1} and answer == ANSWER
    assert sent["datagrams"] >= len(ANSWER) // DATAGRAM  # every datagram of the answer went through a batch
    assert sent["calls"] * 8 <= sent["datagrams"], sent  # many datagrams a call, not one


@pytest.mark.parametrize("library, batched", [("qh3", False), ("aioquic", True)])
def test_asyncio_s_endpoint_where_batches_are_not_asked_for_or_not_there(identity, library, batched) -> None:
    header, answer, transport = asyncio.run(_exchange(identity, library, 100_000, batched=batched))
    assert header == {"n": 1} and answer == ANSWER[:100_000]
    assert not hasattr(transport, "sendto_many")
