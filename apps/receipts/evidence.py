"""A kept batch handed to another holder of the expert, and the signed verdict it answers with.

Pure module (no Django, no transport). docs/protocol.md ("Disputes by another holder") states
the same rules for another implementation.

    kept_batch(wire, batch, carrier, sketch)  -> KeptBatch, or ReceiptError naming what does not bind
    verdict_body(...) / sign_verdict(body, key) -> the verifier's signed answer (receipt/verify)
    verify_verdict(wire, expect, worst_row)   -> the body, or ReceiptError (reason bad_verdict)

A kept batch is evidence only when everything in it is bound by the holder's signature: the
receipt's commitment hash and signature verify under its provider id, the carrier is the one
whose hash it signed, and the sketch is the one whose hash it signed (for batch `batch` of a
v2 receipt, that entry's). Whoever hands it over can change nothing without it failing here.

A verdict is the verifier's signed statement of what its own re-execution found: upheld or not,
the difference and tolerance in millionths of a row's scale (integers: the canonical text has
no floats), the worst row and the BLAKE3 of that row as the verifier recomputed it (the f32
bytes travel with the verdict, so the router can hold them against its own recomputation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from apps.receipts.commitment import (
    BATCHES_FIELDS,
    BATCHES_VERSION,
    BODY_FIELDS,
    HEX64,
    HEX128,
    RECEIPT_VERSION,
    ReceiptError,
    SignedReceipt,
    batch_commitment,
    blake3_hex,
    canonical_text,
    signed_receipt,
    sketch_rows,
)
from apps.receipts.verdict import Comparison
from core.formats.wire import WIRE_CODECS, decode_rows, encoded_row_bytes

VERDICT_VERSION = 1
VERDICT_DOMAIN = b"tenzro/verdict/v1\n"
VERDICT_FIELDS = ("v", "verifier_id", "provider_id", "commitment", "model_id", "layer", "expert", "blob_uri",
                  "upheld", "difference_ppm", "tolerance_ppm", "worst_row", "worst_row_hash")
PPM_CAP = 2**53  # an infinite or absurd difference is reported as this many millionths


def _int(value: Any, name: str, *, low: int = 0, high: int = 2**31) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ReceiptError(f"the receipt's {name} must be an integer in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True)
class KeptBatch:
    """One batch of a signed receipt with what a re-execution needs, every part bound by the signature."""

    receipt: SignedReceipt
    batch: int | None  # its entry in a v2 receipt's `batches`; None for a v1 receipt
    commitment: str  # what sampling, settlement and disputes know the batch by
    expert: int
    hidden: np.ndarray  # f32 [n, d_model]: the batch's input rows, as the holder decoded them
    indices: np.ndarray  # int64 [n, k]: the committed sketch
    values: np.ndarray  # f32 [n, k]

    @property
    def body(self) -> dict[str, Any]:
        return self.receipt.body


def carrier_bytes(wire: Mapping[str, Any]) -> int:
    """The exact byte length of the carrier a (well-formed) receipt body was signed over."""
    tokens = wire.get("token_indices")
    if not isinstance(tokens, list) or wire.get("input_encoding") not in WIRE_CODECS:
        raise ReceiptError("the receipt's token_indices must be a list and its input_encoding a codec of "
                           f"{list(WIRE_CODECS)}")
    return len(tokens) * encoded_row_bytes(wire["input_encoding"], _int(wire.get("d_model"), "d_model", low=1,
                                                                         high=1 << 20))


def kept_batch(wire: Any, batch: Any, carrier: bytes | bytearray | memoryview,
               sketch: bytes | bytearray | memoryview) -> KeptBatch:
    """Check a kept batch handed over as evidence: `wire` the receipt as it came (body fields,
    commitment_hash, signature), `batch` its entry for a v2 receipt (None for v1), the exact carrier
    the holder received, and that batch's sketch. Raises ReceiptError naming what does not bind."""
    if not isinstance(wire, Mapping):
        raise ReceiptError("the receipt must be an object")
    version = wire.get("v")
    if version not in (RECEIPT_VERSION, BATCHES_VERSION) or type(version) is not int:
        raise ReceiptError(f"receipt version {version!r}: this node checks versions 1 and 2")
    body = {name: wire.get(name) for name in (BODY_FIELDS if version == RECEIPT_VERSION else BATCHES_FIELDS)}
    provider = body["provider_id"]
    if not isinstance(provider, str) or not HEX64.match(provider):
        raise ReceiptError("the receipt's provider_id must be 64 lowercase hex digits")
    if not isinstance(body["model_id"], str) or not body["model_id"]:
        raise ReceiptError("the receipt's model_id must be a non-empty string")
    _int(body["layer"], "layer")
    k = _int(body["k"], "k", low=1, high=1024)
    tokens = body["token_indices"]
    if not isinstance(tokens, list) or any(type(t) is not int or t < 0 for t in tokens):
        raise ReceiptError("the receipt's token_indices must be a list of non-negative integers")
    if body["output_encoding"] not in WIRE_CODECS:
        raise ReceiptError(f"the receipt's output_encoding must be one of {list(WIRE_CODECS)}")
    if len(carrier) != (expected := carrier_bytes(body)):
        raise ReceiptError(f"the carrier has {len(carrier)} bytes, the receipt's rows take {expected}")
    if version == RECEIPT_VERSION:
        if batch is not None:
            raise ReceiptError("a version 1 receipt has one batch: send batch null")
        expert, rows, sketch_hash = _int(body["expert"], "expert"), list(range(len(tokens))), body["sketch_hash"]
    else:
        listed = body["batches"]
        if not isinstance(listed, list) or type(batch) is not int or not 0 <= batch < len(listed):
            raise ReceiptError(f"batch must be the index of an entry of the receipt's batches, got {batch!r}")
        entry = listed[batch]
        if not isinstance(entry, Mapping) or not isinstance(entry.get("rows"), list) or any(
                type(r) is not int or not 0 <= r < len(tokens) for r in entry["rows"]):
            raise ReceiptError(f"the receipt's batch {batch} must list rows of its carrier")
        expert, rows, sketch_hash = _int(entry.get("expert"), "expert"), entry["rows"], entry.get("sketch_hash")
    receipt = signed_receipt(wire, body, provider)  # the commitment hash and the signature
    if blake3_hex(carrier) != body["input_hash"]:
        raise ReceiptError("the carrier is not the one the receipt was signed over (its input_hash)")
    if len(sketch) != len(rows) * k * 8 or blake3_hex(sketch) != sketch_hash:
        raise ReceiptError("the sketch is not the one the receipt commits to for this batch")
    try:
        hidden = decode_rows(bytes(carrier), body["input_encoding"], tokens=len(tokens), d_model=body["d_model"])
    except ValueError as exc:
        raise ReceiptError(f"the carrier does not decode: {exc}") from exc
    indices, values = sketch_rows(bytes(sketch), tokens=len(rows), k=k)
    if indices.size and int(indices.max()) >= body["d_model"]:
        raise ReceiptError("the sketch names features past d_model")
    commitment = receipt.commitment_hash if batch is None else batch_commitment(receipt.commitment_hash, batch)
    return KeptBatch(receipt, batch, commitment, expert, hidden[rows], indices, values)


def _ppm(value: float) -> int:
    return PPM_CAP if not math.isfinite(value) else min(PPM_CAP, max(0, round(value * 1e6)))


def verdict_body(*, verifier_id: str, kept: KeptBatch, blob_uri: str, comparison: Comparison,
                 worst_row: bytes) -> dict[str, Any]:
    """What a verifier signs about `kept`: `worst_row` is its recomputed f32 row where the difference
    was measured (empty for an empty batch)."""
    body = kept.body
    return {"v": VERDICT_VERSION, "verifier_id": verifier_id, "provider_id": body["provider_id"],
            "commitment": kept.commitment, "model_id": body["model_id"], "layer": body["layer"],
            "expert": kept.expert, "blob_uri": blob_uri, "upheld": bool(comparison.upheld),
            "difference_ppm": _ppm(comparison.difference), "tolerance_ppm": _ppm(comparison.tolerance),
            "worst_row": comparison.worst_row, "worst_row_hash": blake3_hex(worst_row)}


def sign_verdict(body: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    """The verdict as it travels: its fields and `signature`, ed25519 over VERDICT_DOMAIN + canonical text."""
    if key.verify_key.encode().hex() != body["verifier_id"]:
        raise ValueError("a verdict is signed by its own verifier's key")
    return {**body, "signature": key.sign(VERDICT_DOMAIN + canonical_text(body).encode("ascii")).signature.hex()}


def verify_verdict(wire: Any, *, verifier_id: str, provider_id: str, commitment: str, model_id: str, layer: int,
                   expert: int, blob_uri: str, worst_row: bytes) -> dict[str, Any]:
    """The verdict's body, once it is shown to be the asked verifier's answer about exactly this batch,
    with `worst_row` (the bytes that came with it) the row it names. ReceiptError (bad_verdict) else."""
    if not isinstance(wire, Mapping):
        raise ReceiptError("the verdict is not an object", reason="bad_verdict")
    body = {name: wire.get(name) for name in VERDICT_FIELDS}
    want = {"v": VERDICT_VERSION, "verifier_id": verifier_id, "provider_id": provider_id, "commitment": commitment,
            "model_id": model_id, "layer": layer, "expert": expert, "blob_uri": blob_uri,
            "worst_row_hash": blake3_hex(worst_row)}
    for name, value in want.items():
        if body[name] != value or type(body[name]) is not type(value):
            raise ReceiptError(f"the verdict's {name} is {body[name]!r}, expected {value!r}", reason="bad_verdict")
    if type(body["upheld"]) is not bool or any(type(body[n]) is not int or body[n] < -1 for n in (
            "difference_ppm", "tolerance_ppm", "worst_row")):
        raise ReceiptError("the verdict's upheld, difference_ppm, tolerance_ppm and worst_row are malformed",
                           reason="bad_verdict")
    signature = wire.get("signature")
    if not isinstance(signature, str) or not HEX128.match(signature) or not HEX64.match(verifier_id):
        raise ReceiptError("the verdict's signature is not 128 lowercase hex digits", reason="bad_verdict")
    try:
        VerifyKey(bytes.fromhex(verifier_id)).verify(VERDICT_DOMAIN + canonical_text(body).encode("ascii"),
                                                     bytes.fromhex(signature))
    except (BadSignatureError, ValueError) as exc:
        raise ReceiptError(f"the verdict is not signed by verifier {verifier_id[:16]}…", reason="bad_verdict") from exc
    return {**body, "signature": signature}
