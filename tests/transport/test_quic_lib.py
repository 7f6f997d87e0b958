"""The QUIC library seam and the UDP facts the transport sizes itself by (real sockets, no mocks)."""

import asyncio
import importlib
import socket

import pytest

from apps.node.identity import load_or_create_identity
from core.transport import quic_lib
from core.transport.framing import Reply
from core.transport.quic import QuicSettings, quic_call, start_server
from core.transport.udp import datagram_size_for, interface_mtu, route_mtu, tune_socket


def test_the_library_comes_from_the_environment_with_qh3_as_default(monkeypatch) -> None:
    monkeypatch.delenv("TENZRO_QUIC_LIB", raising=False)
    assert QuicSettings(max_body=1).library == "qh3"
    monkeypatch.setenv("TENZRO_QUIC_LIB", "aioquic")
    assert QuicSettings(max_body=1).library == "aioquic"
    assert QuicSettings(max_body=1, library="qh3").library == "qh3"  # an explicit choice wins
    with pytest.raises(ValueError, match="unknown QUIC library"):
        quic_lib.load("quiche")


def test_knobs_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("TENZRO_QUIC_MAX_DATAGRAM", "9000")
    monkeypatch.setenv("TENZRO_QUIC_SOCKET_BUFFER", "0")
    settings = QuicSettings(max_body=1)
    assert settings.max_datagram_size == 9000 and settings.socket_buffer_bytes == 0
    monkeypatch.setenv("TENZRO_QUIC_STREAM_WINDOW", "lots")
    with pytest.raises(ValueError, match="TENZRO_QUIC_STREAM_WINDOW"):
        QuicSettings(max_body=1)


def test_lanes_come_from_the_environment_within_what_a_peer_door_admits(monkeypatch) -> None:
    assert QuicSettings(max_body=1).max_lanes == 16
    monkeypatch.setenv("TENZRO_QUIC_LANES", "1")
    assert QuicSettings(max_body=1).max_lanes == 1
    for bad in ("0", "33"):
        monkeypatch.setenv("TENZRO_QUIC_LANES", bad)
        with pytest.raises(ValueError, match="TENZRO_QUIC_LANES must be 1-32"):
            QuicSettings(max_body=1)


def test_aioquic_offers_congestion_controls_and_refuses_unknown_ones() -> None:
    settings = QuicSettings(max_body=1, library="aioquic", congestion_control="cubic")
    assert settings.configuration(is_client=True, datagram_size=1200).congestion_control_algorithm == "cubic"
    with pytest.raises(ValueError, match="congestion control"):
        QuicSettings(max_body=1, library="aioquic", congestion_control="bbr").configuration(is_client=True,
                                                                                             datagram_size=1200)


def test_the_qh3_client_advertises_the_datagram_size_it_receives() -> None:
    """qh3 alone would say 1,472 bytes, and a qh3 server would answer in datagrams that small."""
    quic_lib.load("qh3")
    bridge = importlib.import_module("qh3.quic.tls_bridge")
    ours = QuicSettings(max_body=1, library="qh3").configuration(is_client=True, datagram_size=60_000)
    plain = quic_lib.load("qh3").configuration_class(is_client=True, alpn_protocols=["x"])
    advertised = []
    for configuration in (ours, plain):
        tls = bridge.QuicTlsBridge(configuration, version=1, local_initial_source_connection_id=b"12345678",
                                   remote_initial_source_connection_id=None,
                                   original_destination_connection_id=b"abcdefgh", retry_source_connection_id=None,
                                   session_ticket_fetcher=None, session_ticket_handler=None, quic_logger=None,
                                   version_change_handler=None)
        parameters = bridge.pull_quic_transport_parameters(bridge.Buffer(data=tls.serialize_transport_parameters()))
        advertised.append(parameters.max_udp_payload_size)
    assert advertised == [60_000, 1472]  # other qh3 users in the process are left alone


def test_loopback_path_mtu_and_datagram_sizes() -> None:
    assert route_mtu("127.0.0.1", 9) >= 1500
    assert interface_mtu("127.0.0.1") >= 1500
    assert interface_mtu("192.0.2.255") is None  # nobody here owns that address
    assert datagram_size_for(65_536, "127.0.0.1", ceiling=65_000) == 65_000
    assert datagram_size_for(1500, "10.0.0.1", ceiling=65_000) == 1472
    assert datagram_size_for(1500, "fe80::1", ceiling=65_000) == 1452
    assert datagram_size_for(1500, "::ffff:10.0.0.1", ceiling=65_000) == 1472
    assert datagram_size_for(None, "10.0.0.1", ceiling=65_000) == 1200  # unknown: QUIC's minimum
    assert datagram_size_for(65_536, "127.0.0.1", ceiling=16_384, configured=9000) == 9000
    assert datagram_size_for(65_536, "127.0.0.1", ceiling=16_384, configured=60_000) == 16_384


def test_socket_buffers_report_what_the_kernel_granted() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        default = tune_socket(sock, 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        asked = tune_socket(sock, 1 << 20)
    assert default is not None and asked is not None
    assert asked.requested == 1 << 20
    assert asked.receive >= default.receive and asked.send >= default.send


@pytest.mark.parametrize(("client", "server"), [("aioquic", "qh3"), ("qh3", "aioquic")])
def test_the_libraries_talk_to_each_other(tmp_path, client, server) -> None:
    # and quietly: qh3's server fails transmits during an aioquic client's handshake (its flight
    # does not fit yet); those are retried, not left to the loop as ERROR tracebacks
    identity = load_or_create_identity(tmp_path / "server")
    body = bytes(range(256)) * 4096  # 1 MiB: each side at its own datagram size

    async def echo(request):
        return Reply.ok({"len": len(request.body)}, bytes(request.body))

    escaped: list[dict] = []

    async def scenario():
        asyncio.get_running_loop().set_exception_handler(lambda _, context: escaped.append(context))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        listening = await start_server(host="127.0.0.1", port=port, cert_path=str(identity.cert_path),
                                       key_path=str(identity.cert_key_path), handler=echo,
                                       settings=QuicSettings(max_body=1 << 22, library=server))
        try:
            return await quic_call(host="127.0.0.1", port=port, pin_sha256=identity.cert_sha256, method="echo",
                                   params={}, body=body, settings=QuicSettings(max_body=1 << 22, library=client))
        finally:
            listening.close()

    result, reply = asyncio.run(scenario())
    assert result == {"len": len(body)} and bytes(reply) == body
    assert escaped == []
