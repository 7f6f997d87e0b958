"""The peer door's wire: length-prefixed frames (framing), the QUIC server and client over aioquic's
or qh3's API (quic, quic_server, quic_client, pool), certificate pinning and per-peer admission.
It knows frames and peers, not what they carry (import contract `transport`).
"""
