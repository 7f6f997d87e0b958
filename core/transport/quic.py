"""The QUIC transport of the peer door (ALPN `tenzro/moe`): the public face of its modules.

* quic_config.py — `QuicSettings` (datagram size, flow-control windows, congestion control,
  socket buffers, library; defaults from TENZRO_QUIC_*), `TransportError`, `ALPN`;
* quic_lib.py — the one seam that imports a QUIC library (qh3 by default, or aioquic);
* quic_server.py — `start_server`: one request frame per stream, admitted per peer, one
  async handler; a stream the client resets cancels its handler;
* quic_client.py — pinned connections (`quic_connection`, `quic_call`); pool.py keeps one
  connection per peer for many calls;
* framing.py — the frames on a stream; udp.py — path MTU and socket buffers.

docs/protocol.md ("QUIC") is the normative description.
"""

from __future__ import annotations

from core.transport.quic_client import QuicPeerConnection, quic_call, quic_connection
from core.transport.quic_config import ALPN, QuicSettings, TransportError
from core.transport.quic_server import SHUTTING_DOWN, PeerRequest, PeerServer, ServerHandler, start_server

__all__ = [
    "ALPN",
    "SHUTTING_DOWN",
    "PeerRequest",
    "PeerServer",
    "QuicPeerConnection",
    "QuicSettings",
    "ServerHandler",
    "TransportError",
    "quic_call",
    "quic_connection",
    "start_server",
]
