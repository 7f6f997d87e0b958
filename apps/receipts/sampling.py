"""Which verified receipts a router keeps in full: 1 in N, chosen by a keyed hash it alone can compute.

Pure module. A public rule (say, commitment hash mod 64 == 0) would let a holder compute which
of its batches a router keeps and lie on all the others; keying BLAKE3 with a secret of the
router makes the choice a pseudo-random function of the commitment that the holder cannot
evaluate. The key is derived from the router's own node seed (BLAKE3's key-derivation mode
with a context string of this purpose), so nothing new has to be stored or backed up, and
the seed itself never leaves the node.

    keep = u64_le(BLAKE3_keyed(key, commitment_hash_bytes)[:8]) < floor(2**64 / N)
"""

from __future__ import annotations

import blake3

SAMPLING_CONTEXT = "tenzro 2026-12 receipt sampling key v1"


def sampling_key(node_seed: bytes) -> bytes:
    """The router's 32-byte sampling key, derived from its 32-byte ed25519 seed."""
    if len(node_seed) != 32:
        raise ValueError(f"a node seed has 32 bytes, got {len(node_seed)}")
    return blake3.blake3(node_seed, derive_key_context=SAMPLING_CONTEXT).digest()


def keep_receipt(key: bytes, commitment_hash: str, one_in: int) -> bool:
    """True for about 1 in `one_in` commitment hashes (all of them when one_in <= 1)."""
    if one_in <= 1:
        return True
    draw = int.from_bytes(blake3.blake3(bytes.fromhex(commitment_hash), key=key).digest(8), "little")
    return draw < (1 << 64) // one_in
