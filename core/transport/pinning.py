"""Certificate pinning: peers trust a QUIC certificate by its fingerprint, not by a CA."""

from __future__ import annotations

import hashlib


def certificate_sha256(cert_der: bytes) -> str:
    """The pin of a certificate: SHA-256 of its DER encoding, 64 lowercase hex digits."""
    return hashlib.sha256(cert_der).hexdigest()
