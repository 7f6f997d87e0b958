"""Who else holds a blob: a lookup other parts register (apps/providers knows it from gossip).

The blob store sits below the provider registry, so the registry registers a function here
(in its AppConfig.ready) instead of the store importing it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PeerBlobEndpoint:
    """A peer that announces the blob: its QUIC door with the pin from its signed record, and HTTP."""

    quic_endpoint: str | None
    quic_cert_sha256: str | None
    http_endpoint: str | None
    provider_id: str | None = None
    announces: bool = False  # its record announces the blob (a holding); else a provider merely worth asking


Lookup = Callable[[str], list[PeerBlobEndpoint]]
_LOOKUPS: list[Lookup] = []


def blob_holders_lookup(lookup: Lookup) -> Lookup:
    """Register `lookup(hash) -> [PeerBlobEndpoint]` (sync: it reads the database)."""
    if lookup not in _LOOKUPS:
        _LOOKUPS.append(lookup)
    return lookup


def blob_holders(hash_: str) -> list[PeerBlobEndpoint]:
    holders: list[PeerBlobEndpoint] = []
    for lookup in _LOOKUPS:
        holders.extend(lookup(hash_))
    return holders
