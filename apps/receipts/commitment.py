"""Execution receipts: the holder's signed commitment to a batch's output rows.

Pure module (no Django, no transport): the expert worker signs with it as a holder, the
forward verifies with it inline as a router, a dispute recomputes with it. docs/protocol.md
("Receipts") states the same rules for another implementation; tests/receipts has a second
verifier written from that text alone.

    sketch_bytes(rows f32 [n, d], k)        -> per row: k uint32 LE indices, then k f32 LE values
    receipt_body(...)                        -> the fields the holder signs (canonical JSON object)
    sign_receipt(body, signing_key)          -> SignedReceipt (commitment hash + signature)
    verify_receipt(wire, expect, rows)       -> SignedReceipt, or ReceiptError naming the check
    batches_receipt_body(...)                -> v2: one holder's every expert batch of a layer step
    verify_batches_receipt(wire, expect, answers) -> SignedReceipt and each batch's sketch
    batch_commitment(commitment_hash, i)     -> the commitment of batch i of a v2 receipt

The sketch of a row is its k features of largest absolute value (ties: the lower index),
listed in ascending index order with the exact f32 bits the router received; the rows are
the ones on the wire (a Q8_0 answer is committed as it decodes, so the router can recompute
the sketch from what it got). The commitment hash is BLAKE3 of the canonical JSON text of
the body, which binds the sketch's hash, the hash of the exact input carrier bytes, the
model/layer/expert, the token set and the holder's provider id; the signature is ed25519
over RECEIPT_DOMAIN + that text, by the key whose public half is the provider id.

A multi-expert request (docs/protocol.md, "Multi-expert execute") is answered with one receipt,
version 2, whose body lists every batch it served ({expert, rows, sketch_hash}) over one input
carrier: one signature per holder per layer step, while each batch keeps a commitment of its
own (`batch_commitment`), so sampling, settlement and disputes still work batch by batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any

import blake3
import numpy as np
import orjson
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from core.formats.wire import decode_rows, encoded_row_bytes

try:  # the compiled selection; the numpy reference does the same where numba is missing
    from apps.receipts.topk_kernel import sketch_q8_0_parts as _sketch_q8_0_parts
    from apps.receipts.topk_kernel import topk_rows as _topk_rows
except ImportError:  # pragma: no cover - numba is in requirements.txt
    _topk_rows = _sketch_q8_0_parts = None

RECEIPT_VERSION = 1
RECEIPT_DOMAIN = b"tenzro/receipt/v1\n"
BATCHES_VERSION = 2
BATCHES_DOMAIN = b"tenzro/receipt/v2\n"
_DOMAINS = {RECEIPT_VERSION: RECEIPT_DOMAIN, BATCHES_VERSION: BATCHES_DOMAIN}
HEX64 = re.compile(r"[0-9a-f]{64}\Z")
HEX128 = re.compile(r"[0-9a-f]{128}\Z")
BODY_FIELDS = ("v", "provider_id", "model_id", "layer", "expert", "token_indices", "d_model", "input_encoding",
               "input_hash", "output_encoding", "k", "sketch_hash")
BATCHES_FIELDS = ("v", "provider_id", "model_id", "layer", "token_indices", "d_model", "input_encoding",
                  "input_hash", "output_encoding", "k", "batches")


class ReceiptError(ValueError):
    """A receipt that does not prove what it should; `reason` is receipt_missing or bad_receipt."""

    def __init__(self, message: str, *, reason: str = "bad_receipt") -> None:
        super().__init__(message)
        self.reason = reason


def topk_indices(rows: np.ndarray, k: int) -> np.ndarray:
    """int64 [n, k]: per row the k indices of largest |value|, ties to the lower index, ascending.

    The compiled kernel (apps.receipts.topk_kernel) when numba is there, else topk_reference."""
    n, d = rows.shape
    k = min(k, d)
    if _topk_rows is None or n == 0 or k == 0:
        return topk_reference(rows, k)
    return _topk_rows(np.ascontiguousarray(rows, dtype=np.float32), k)


def topk_reference(rows: np.ndarray, k: int) -> np.ndarray:
    """The numpy form of the same rule, O(d) per row: a partition finds t, the k-th largest |v|;
    every |v| > t is in, and the first (k - count above) of the |v| == t."""
    n, d = rows.shape
    k = min(k, d)
    if n == 0 or k == 0:
        return np.empty((n, k), dtype=np.int64)
    mag = np.abs(rows)  # (n, d) f32
    t = np.partition(mag, d - k, axis=1)[:, d - k]  # (n,) the k-th largest magnitude
    above = mag > t[:, None]
    at = mag == t[:, None]
    room = k - above.sum(axis=1)  # (n,) how many ties at t still fit
    chosen = above | (at & (np.cumsum(at, axis=1) <= room[:, None]))
    return np.nonzero(chosen)[1].reshape(n, k)  # nonzero walks rows in order, columns ascending


def sketch_bytes(rows: np.ndarray, k: int) -> bytes:
    """The canonical sketch of rows f32 [n, d]: for each row, k uint32 LE indices then k f32 LE values."""
    rows = np.ascontiguousarray(rows, dtype="<f4")
    idx = topk_indices(rows, k)  # (n, k)
    return _pack(idx, np.take_along_axis(rows, idx, axis=1))  # the exact f32 bits


def _pack(idx: np.ndarray, values: np.ndarray) -> bytes:
    out = np.empty((idx.shape[0], 2 * idx.shape[1]), dtype="<u4")
    out[:, : idx.shape[1]] = idx
    out[:, idx.shape[1]:] = values.astype("<f4", copy=False).view("<u4")
    return out.tobytes()


def answer_sketch(answer: bytes | bytearray | memoryview, encoding: str, *, tokens: int, d_model: int,
                  k: int) -> bytes:
    """The sketch of an encoded answer: the same bytes as sketch_bytes(decoded rows, k), computed
    from Q8_0 blocks directly when the compiled kernel is there (no decode, most blocks skipped)."""
    return answer_sketches([answer], encoding, tokens=[tokens], d_model=d_model, k=k)[0][0]


def answer_sketches(answers: Sequence[bytes | bytearray | memoryview], encoding: str, *, tokens: Sequence[int],
                    d_model: int, k: int) -> tuple[list[bytes], list[bool | None]]:
    """answer_sketch of several answers (answers[i] of tokens[i] rows), Q8_0 ones in one kernel call, and
    per answer whether its rows are all finite where the kernel can tell from its block scales (None:
    not looked at; the caller checks the decoded rows). ValueError on a wrong byte count."""
    k = min(k, d_model)
    if encoding == "q8_0" and _sketch_q8_0_parts is not None and k:
        row_bytes = encoded_row_bytes(encoding, d_model)
        for i, (answer, n) in enumerate(zip(answers, tokens, strict=True)):
            if len(answer) != n * row_bytes:
                raise ValueError(f"Q8_0 rows [{n}, {d_model}] need {n * row_bytes} bytes, got {len(answer)} "
                                 f"(answer {i})")
        sketch, finite = _sketch_q8_0_parts(answers, d_model=d_model, k=k)  # uint32 [all rows, 2k]
        raw = sketch.astype("<u4", copy=False).tobytes()
        ends = accumulate(n * 8 * k for n in tokens)  # each row's sketch: k indices and k values, 4 bytes each
        return [raw[a:b] for a, b in pairwise([0, *ends])], list(finite)
    return ([sketch_bytes(decode_rows(answer, encoding, tokens=n, d_model=d_model), k)
             for answer, n in zip(answers, tokens, strict=True)], [None] * len(answers))


def sketch_rows(sketch: bytes, *, tokens: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of sketch_bytes: (indices int64 [tokens, k], values f32 [tokens, k])."""
    raw = np.frombuffer(sketch, dtype="<u4")
    if raw.size != tokens * 2 * k:
        raise ValueError(f"a sketch of {tokens} rows of k={k} has {tokens * 8 * k} bytes, got {len(sketch)}")
    raw = raw.reshape(tokens, 2 * k)
    return raw[:, :k].astype(np.int64), raw[:, k:].view("<f4")


def blake3_hex(data: bytes | bytearray | memoryview) -> str:
    return blake3.blake3(data, max_threads=1).hexdigest()


def canonical_text(body: Mapping[str, Any]) -> str:
    """Sorted keys, no whitespace, non-ASCII escaped (json.dumps' ensure_ascii): the signed text."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def receipt_text(body: Mapping[str, Any]) -> bytes:
    """canonical_text(body) as bytes, for a body of strings, integers, and lists and objects of them,
    never a float (orjson writes floats its own way): a receipt body built here, or one whose every
    field was checked against a request. orjson writes those bytes ~13x faster than json does; where
    they would differ (text to escape: a character past `~`; an integer past 64 bits; a key that is
    not a string) canonical_text, the definition, writes them."""
    try:
        raw = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError is one
        return canonical_text(body).encode("ascii")
    return raw if raw.isascii() and b"\x7f" not in raw else canonical_text(body).encode("ascii")


def receipt_body(*, provider_id: str, model_id: str, layer: int, expert: int, token_indices: Sequence[int],
                 d_model: int, input_encoding: str, input_carrier: bytes | bytearray | memoryview,
                 output_encoding: str, k: int, sketch: bytes) -> dict[str, Any]:
    """The fields a receipt signs, from the exact input carrier bytes and the committed sketch."""
    return {"v": RECEIPT_VERSION, "provider_id": provider_id, "model_id": model_id, "layer": int(layer),
            "expert": int(expert), "token_indices": [int(t) for t in token_indices], "d_model": int(d_model),
            "input_encoding": input_encoding, "input_hash": blake3_hex(input_carrier),
            "output_encoding": output_encoding, "k": int(k), "sketch_hash": blake3_hex(sketch)}


@dataclass(frozen=True)
class SignedReceipt:
    body: dict[str, Any]
    commitment_hash: str  # BLAKE3 hex of canonical_text(body)
    signature: str  # 128 hex: ed25519 over RECEIPT_DOMAIN + canonical_text(body)

    def to_wire(self) -> dict[str, Any]:
        """What travels in moe/execute's answer header under `receipt`."""
        return {**self.body, "commitment_hash": self.commitment_hash, "signature": self.signature}


def sign_receipt(body: dict[str, Any], key: SigningKey) -> SignedReceipt:
    """Sign a body of either version (its `v` picks the domain separator)."""
    if key.verify_key.encode().hex() != body["provider_id"]:
        raise ValueError("a receipt is signed by its own holder's key")
    text = receipt_text(body)
    return SignedReceipt(body, blake3_hex(text), key.sign(_DOMAINS[body["v"]] + text).signature.hex())


def batches_receipt_body(*, provider_id: str, model_id: str, layer: int, token_indices: Sequence[int], d_model: int,
                         input_encoding: str, input_carrier: bytes | bytearray | memoryview, output_encoding: str,
                         k: int, batches: Sequence[tuple[int, Sequence[int], bytes]]) -> dict[str, Any]:
    """The fields a v2 receipt signs: one carrier of rows (`token_indices`: each row's token), and per
    batch (expert, rows into the carrier, sketch of the expert's output rows), in request order."""
    return {"v": BATCHES_VERSION, "provider_id": provider_id, "model_id": model_id, "layer": int(layer),
            "token_indices": [int(t) for t in token_indices], "d_model": int(d_model),
            "input_encoding": input_encoding, "input_hash": blake3_hex(input_carrier),
            "output_encoding": output_encoding, "k": int(k),
            "batches": [{"expert": int(e), "rows": [int(r) for r in rows], "sketch_hash": blake3_hex(sketch)}
                        for e, rows, sketch in batches]}


def batch_commitment(commitment_hash: str, index: int) -> str:
    """The commitment of batch `index` of a v2 receipt: BLAKE3 (hex) of "<commitment_hash>/<index>".

    What the router's sampling draws on, a settlement binds to and a kept batch is stored under,
    so each batch of one signed receipt is sampled, paid and disputed on its own."""
    return blake3_hex(f"{commitment_hash}/{int(index)}".encode("ascii"))


@dataclass(frozen=True)
class Expected:
    """What the router asked for, and so what a receipt must state."""

    provider_id: str
    model_id: str
    layer: int
    expert: int
    token_indices: Sequence[int]
    d_model: int
    input_encoding: str
    input_hash: str
    output_encoding: str
    k: int


def verify_receipt(wire: Any, expect: Expected, rows: np.ndarray, answer: bytes | bytearray | memoryview | None = None,
                   ) -> tuple[SignedReceipt, bytes]:
    """Check a holder's receipt against the request and the rows f32 [n, d_model] it returned
    (`answer`: the same rows as they came, in expect.output_encoding: a faster sketch for Q8_0).

    Returns the receipt and the recomputed sketch. Raises ReceiptError naming the first check
    that fails: present, well-formed, bound to the provider, the model/layer/expert, the token
    set, the input carrier, k, the sketch of the returned rows, the commitment hash, the signature.
    """
    body = _checked_body(wire, expect, BODY_FIELDS, RECEIPT_VERSION)
    if body["expert"] != expect.expert or type(body["expert"]) is not int:
        raise ReceiptError(f"the receipt names another expert: expert is {body['expert']!r}, "
                           f"expected {expect.expert!r}")
    if answer is not None:
        [sketch], [finite] = answer_sketches([answer], expect.output_encoding, tokens=[rows.shape[0]],
                                             d_model=rows.shape[1], k=expect.k)
    else:
        sketch, finite = sketch_bytes(rows, expect.k), None
    if not _finite(rows, finite):
        raise ReceiptError("the returned rows are not all finite")
    if body["sketch_hash"] != blake3_hex(sketch):
        raise ReceiptError("the receipt's commitment does not match the returned rows")
    return signed_receipt(wire, body, expect.provider_id, checked=True), sketch


def _checked_body(wire: Any, expect: Expected | ExpectedBatches, fields: tuple[str, ...], version: int
                  ) -> dict[str, Any]:
    """The receipt's body fields, checked against what the router asked of either version: present,
    an object, the version, the provider, model, layer, width, encodings, input hash, k, token set."""
    if wire is None:
        raise ReceiptError(f"holder {expect.provider_id[:16]}… answered without a receipt", reason="receipt_missing")
    if not isinstance(wire, Mapping):
        raise ReceiptError("the receipt is not an object")
    body = {name: wire.get(name) for name in fields}
    if body["v"] != version or type(body["v"]) is not int:
        raise ReceiptError(f"receipt version {body['v']!r}, this answer needs version {version}")
    checks = (("provider_id", expect.provider_id, "the receipt is not bound to the holder that answered"),
              ("model_id", expect.model_id, "the receipt names another model"),
              ("layer", expect.layer, "the receipt names another layer"),
              ("d_model", expect.d_model, "the receipt names another d_model"),
              ("input_encoding", expect.input_encoding, "the receipt names another input encoding"),
              ("input_hash", expect.input_hash, "the receipt is over different input than was sent"),
              ("output_encoding", expect.output_encoding, "the receipt names another output encoding"),
              ("k", expect.k, "the receipt commits to another number of features per row"))
    for name, want, why in checks:
        if body[name] != want or type(body[name]) is not type(want):
            raise ReceiptError(f"{why}: {name} is {body[name]!r}, expected {want!r}")
    tokens = body["token_indices"]
    # list(): numpy ints compare equal to the wire's ints; the type check below refuses true and 1.0
    if not isinstance(tokens, list) or tokens != list(expect.token_indices) \
            or any(type(t) is not int for t in tokens):
        raise ReceiptError("the receipt's token set is not the request's")
    return body


def signed_receipt(wire: Mapping[str, Any], body: dict[str, Any], provider_id: str, *, checked: bool = False
                   ) -> SignedReceipt:
    """The body's commitment hash and the holder's signature over it, checked; the signed receipt.
    checked: every field of the body was checked against a request (receipt_text's condition)."""
    text = receipt_text(body) if checked else canonical_text(body).encode("ascii")
    commitment = blake3_hex(text)
    if wire.get("commitment_hash") != commitment:
        raise ReceiptError("the receipt's commitment hash is not the hash of its body")
    signature = wire.get("signature")
    if not isinstance(signature, str) or not HEX128.match(signature) or not HEX64.match(provider_id):
        raise ReceiptError("the receipt's signature is not 128 lowercase hex digits")
    try:
        VerifyKey(bytes.fromhex(provider_id)).verify(_DOMAINS[body["v"]] + text, bytes.fromhex(signature))
    except (BadSignatureError, ValueError) as exc:
        raise ReceiptError(f"the receipt is not signed by holder {provider_id[:16]}…") from exc
    return SignedReceipt(body, commitment, signature)


@dataclass(frozen=True)
class ExpectedBatches:
    """What the router asked of one holder in a multi-expert request, and so what its receipt must state:
    `batches` is [(expert, rows into the carrier)] in request order."""

    provider_id: str
    model_id: str
    layer: int
    token_indices: Sequence[int]
    d_model: int
    input_encoding: str
    input_hash: str
    output_encoding: str
    k: int
    batches: Sequence[tuple[int, Sequence[int]]]


def verify_batches_receipt(wire: Any, expect: ExpectedBatches,
                           answers: Sequence[tuple[np.ndarray, bytes | bytearray | memoryview]],
                           ) -> tuple[SignedReceipt, list[bytes]]:
    """Check a v2 receipt against the request and each batch's returned rows: answers[i] is batch i's
    (rows f32 [n_i, d_model], the same rows as they came in expect.output_encoding).

    Returns the receipt and each batch's recomputed sketch. Raises ReceiptError naming the first
    check that fails, a batch by its expert: one bad batch fails the whole receipt (one signature
    covers them all)."""
    body = _checked_body(wire, expect, BATCHES_FIELDS, BATCHES_VERSION)
    listed = body["batches"]
    if not isinstance(listed, list) or len(listed) != len(expect.batches) or len(answers) != len(expect.batches):
        raise ReceiptError(f"the receipt lists {len(listed) if isinstance(listed, list) else 'no'} batches, "
                           f"the request had {len(expect.batches)}")
    for item, (expert, rows) in zip(listed, expect.batches, strict=True):
        if not isinstance(item, Mapping) or set(item) != {"expert", "rows", "sketch_hash"} \
                or item["expert"] != expert or type(item["expert"]) is not int \
                or item["rows"] != list(rows) or not {*map(type, item["rows"])} <= {int}:
            raise ReceiptError(f"the receipt's entry for expert {expert} is not the batch that was asked")
    sketches, finite = answer_sketches([answer for _, answer in answers], expect.output_encoding,
                                       tokens=[out.shape[0] for out, _ in answers], d_model=expect.d_model, k=expect.k)
    for item, (expert, _), (out, _), sketch, known in zip(listed, expect.batches, answers, sketches, finite,
                                                         strict=True):
        if not _finite(out, known):
            raise ReceiptError(f"the rows returned for expert {expert} are not all finite")
        if item["sketch_hash"] != blake3_hex(sketch):
            raise ReceiptError(f"the receipt's commitment for expert {expert} does not match the returned rows")
    body["batches"] = [dict(item) for item in listed]
    return signed_receipt(wire, body, expect.provider_id, checked=True), sketches


def _finite(rows: np.ndarray, known: bool | None) -> bool:
    """Whether rows are all finite: `known` when the sketch kernel read it off the answer's Q8_0 scales
    (the rows are those bytes decoded), else a look at every value."""
    return known if known is not None else not rows.size or bool(np.isfinite(rows).all())


def signature_valid(receipt: SignedReceipt) -> bool:
    """True when `receipt` (either version) carries its provider's signature (a dispute's fraud proof needs it)."""
    text = canonical_text(receipt.body).encode("ascii")
    try:
        VerifyKey(bytes.fromhex(receipt.body["provider_id"])).verify(_DOMAINS[receipt.body["v"]] + text,
                                                                     bytes.fromhex(receipt.signature))
    except (BadSignatureError, ValueError, TypeError, KeyError):
        return False
    return blake3_hex(text) == receipt.commitment_hash


class ReceiptSigner:
    """The holder's side: signs a receipt for each moe/execute answer with the node key.

    Runs on the worker's compute executor, after the answer is encoded: the sketch is taken of
    `answer` (the encoded rows, exactly as the router will decode them), so the router
    recomputes the same sketch bit for bit."""

    def __init__(self, key: SigningKey) -> None:
        self._key = key
        self.provider_id = key.verify_key.encode().hex()

    def __call__(self, *, model_id: str, layer: int, expert: int, token_indices: Sequence[int], d_model: int,
                 input_encoding: str, input_carrier: bytes | bytearray | memoryview, output_encoding: str,
                 answer: bytes | bytearray | memoryview, k: int) -> dict[str, Any]:
        sketch = answer_sketch(answer, output_encoding, tokens=len(token_indices), d_model=d_model, k=k)
        body = receipt_body(provider_id=self.provider_id, model_id=model_id, layer=layer, expert=expert,
                            token_indices=token_indices, d_model=d_model, input_encoding=input_encoding,
                            input_carrier=input_carrier, output_encoding=output_encoding, k=k, sketch=sketch)
        return sign_receipt(body, self._key).to_wire()

    def batches(self, *, model_id: str, layer: int, token_indices: Sequence[int], d_model: int,
                input_encoding: str, input_carrier: bytes | bytearray | memoryview, output_encoding: str, k: int,
                batches: Sequence[tuple[int, Sequence[int], bytes | bytearray | memoryview]]) -> dict[str, Any]:
        """One v2 receipt over a multi-expert answer: `batches` is [(expert, rows into the carrier,
        that expert's answer rows as encoded)], in request order."""
        sketches, _ = answer_sketches([answer for _, _, answer in batches], output_encoding,
                                      tokens=[len(rows) for _, rows, _ in batches], d_model=d_model, k=k)
        sketched = [(e, rows, sketch) for (e, rows, _), sketch in zip(batches, sketches, strict=True)]
        body = batches_receipt_body(provider_id=self.provider_id, model_id=model_id, layer=layer,
                                    token_indices=token_indices, d_model=d_model, input_encoding=input_encoding,
                                    input_carrier=input_carrier, output_encoding=output_encoding, k=k,
                                    batches=sketched)
        return sign_receipt(body, self._key).to_wire()
