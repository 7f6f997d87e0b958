"""Which blobs are in use: a registry other apps add their references to.

Garbage collection must keep every blob that something on this node still names (a held
expert or gate, a prepare job's output). Those parts sit above the blob store; rather than
the store importing each of them, each registers a function returning the hashes it needs
(in its AppConfig.ready), and GC asks them all.
"""

from __future__ import annotations

from collections.abc import Callable

ReferenceSource = Callable[[], set[str]]
_SOURCES: list[ReferenceSource] = []


def blob_reference_source(source: ReferenceSource) -> ReferenceSource:
    """Register `source()`: every blob hash it returns survives garbage collection."""
    if source not in _SOURCES:
        _SOURCES.append(source)
    return source


def referenced_blob_hashes() -> set[str]:
    """The union of every registered source (sync: sources read the database)."""
    hashes: set[str] = set()
    for source in _SOURCES:
        hashes |= source()
    return hashes
