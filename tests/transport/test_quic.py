"""Real QUIC endpoints on loopback, with each library: framing over QUIC, certificate pinning, peer limits."""

import asyncio
import gc
import logging
import socket

import pytest

from apps.node.identity import load_or_create_identity
from core.transport.admission import PeerLimits
from core.transport.framing import Reply
from core.transport.quic import PeerRequest, QuicSettings, TransportError, quic_call, quic_connection, start_server

MAX_BODY = 8 * 1024 * 1024


@pytest.fixture(autouse=True, params=["qh3", "aioquic"])
def library(request, monkeypatch):
    """Every test runs with each library, chosen as a node chooses it: TENZRO_QUIC_LIB."""
    monkeypatch.setenv("TENZRO_QUIC_LIB", request.param)
    return request.param


def _settings() -> QuicSettings:
    return QuicSettings(max_body=MAX_BODY)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _echo(request: PeerRequest) -> Reply:
    if request.method == "fail":
        return Reply.error("expert_not_loaded", "expert 7 is not loaded here")
    if request.method == "slow":
        await asyncio.sleep(float(request.params.get("s", 0.5)))
    return Reply.ok({"method": request.method, "params": request.params, "body_len": len(request.body),
                     "peer_host": request.peer[0]}, bytes(request.body)[::-1])


@pytest.fixture
def server_identity(tmp_path):
    return load_or_create_identity(tmp_path / "server")


async def _with_server(identity, scenario, *, handler=_echo, server_settings=None, limits=None):
    port = _free_udp_port()
    server = await start_server(host="127.0.0.1", port=port, cert_path=str(identity.cert_path),
                                key_path=str(identity.cert_key_path), handler=handler,
                                settings=server_settings or _settings(),
                                limits=limits)
    try:
        return await scenario(port)
    finally:
        server.close()


def _serve_and_call(identity, *, handler=_echo, server_settings=None, pin=None, limits=None, **call):
    """Start a real server on a free port, make one call, stop the server; returns the call's result."""

    async def scenario(port):
        return await quic_call(host="127.0.0.1", port=port, pin_sha256=pin or identity.cert_sha256,
                               settings=_settings(), **call)

    return asyncio.run(_with_server(identity, scenario, handler=handler, server_settings=server_settings,
                                    limits=limits))


def test_round_trip_with_correct_pin_and_binary_body(server_identity) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB: spans many packets and flow-control updates
    result, reply = _serve_and_call(server_identity, method="moe/echo", params={"k": 1}, body=body)
    assert result == {"method": "moe/echo", "params": {"k": 1}, "body_len": len(body), "peer_host": "127.0.0.1"}
    assert bytes(reply) == body[::-1]


def test_wrong_pin_is_refused_before_any_request(server_identity, tmp_path) -> None:
    other = load_or_create_identity(tmp_path / "other")
    seen = []

    async def recording(request):
        seen.append(request.method)
        return Reply.ok({})

    with pytest.raises(TransportError) as info:
        _serve_and_call(server_identity, handler=recording, pin=other.cert_sha256, method="moe/status", params={})
    assert info.value.reason == "certificate_pin_mismatch"
    assert seen == []


def test_error_reply_reaches_the_caller_with_its_reason(server_identity) -> None:
    with pytest.raises(TransportError) as info:
        _serve_and_call(server_identity, method="fail", params={})
    assert info.value.reason == "expert_not_loaded"


def test_a_handler_that_raises_answers_internal_error_and_the_server_keeps_serving(server_identity) -> None:
    async def broken(request):
        if request.method == "boom":
            raise RuntimeError("bug")
        return Reply.ok({"fine": True})

    async def scenario(port):
        call = {"host": "127.0.0.1", "port": port, "pin_sha256": server_identity.cert_sha256, "settings": _settings()}
        with pytest.raises(TransportError) as info:
            await quic_call(method="boom", params={}, **call)
        assert info.value.reason == "internal_error"
        return await quic_call(method="ok", params={}, **call)

    assert asyncio.run(_with_server(server_identity, scenario, handler=broken))[0] == {"fine": True}


def test_oversized_request_body_is_refused_by_the_server(server_identity) -> None:
    with pytest.raises(TransportError) as info:
        _serve_and_call(server_identity, limits=PeerLimits(max_body=1024), method="moe/echo", params={},
                        body=b"x" * 4096)
    assert info.value.reason == "payload_too_large"


def test_nobody_listening_times_out_cleanly(server_identity, caplog) -> None:
    port = _free_udp_port()
    with pytest.raises(TransportError) as info, caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(quic_call(host="127.0.0.1", port=port, pin_sha256=server_identity.cert_sha256,
                              method="moe/status", params={}, settings=_settings(), timeout_s=1.5))
        gc.collect()  # an orphaned future with an exception nobody read is reported when it is collected
    assert info.value.reason in {"timeout", "connection_failed"}
    assert "never retrieved" not in caplog.text


def test_a_draining_door_finishes_what_it_computes_and_turns_new_requests_away(server_identity) -> None:
    """A stopping node: the answer in flight (a 1 MiB reply computed for 0.5 s) arrives whole; a request
    sent after the drain began is answered shutting_down at once (its router asks another holder)."""
    body = bytes(range(256)) * 4096

    async def scenario():
        port = _free_udp_port()
        server = await start_server(host="127.0.0.1", port=port, cert_path=str(server_identity.cert_path),
                                    key_path=str(server_identity.cert_key_path), handler=_echo, settings=_settings())
        try:
            async with quic_connection(host="127.0.0.1", port=port, pin_sha256=server_identity.cert_sha256,
                                       settings=_settings()) as connection:
                in_flight = asyncio.ensure_future(connection.call("slow", {"s": 0.5}, body, timeout_s=10))
                await asyncio.sleep(0.2)  # it is being computed
                draining = asyncio.ensure_future(server.drain(5.0))
                await asyncio.sleep(0.05)
                with pytest.raises(TransportError) as refused:
                    await connection.call("moe/echo", {}, b"", timeout_s=5)
                answered = await in_flight
                unfinished = await draining
        finally:
            server.close()
        return refused.value, answered, unfinished

    refused, (result, reply), unfinished = asyncio.run(scenario())
    assert refused.reason == "shutting_down" and "stopping" in str(refused)
    assert result["method"] == "slow" and bytes(reply) == body[::-1]
    assert unfinished == 0
