"""Signed provider records and heartbeats: canonical encoding, signing, verification.

Pure module (no Django, no I/O). docs/protocol.md, "Provider records", is the normative
description; keep the two in step.

A record is the `ProviderCapacity` of docs/specification.md ("Provider record"): who a provider
is (its ed25519 public key, hex, IS its provider id), what it serves and where. It travels as an envelope

    {"record": "<canonical JSON text>", "signature": "<128 hex: ed25519 over DOMAIN + text>"}

so a receiver verifies the exact bytes that were signed and never has to re-encode anything.
Canonical JSON: keys sorted, no whitespace, ASCII only (\\u escapes), no floats anywhere (all
numbers are integers; a price is a decimal string), holdings sorted by (model_id, layer,
expert). `seq` grows with every re-issue; the highest one a provider signed wins.

A heartbeat is a small signed statement `{provider_id, seq, at_ms}`: "my record `seq` is still
current at `at_ms`". Liveness rides heartbeats, so an unchanged record is never resent in full
just to stay alive; records expire when their provider's heartbeats stop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from core.errors import InvalidInput

RECORD_DOMAIN = b"tenzro/provider-record/v1\n"
HEARTBEAT_DOMAIN = b"tenzro/heartbeat/v1\n"
VERSION = 1
ROLES = ("Replica", "Router", "ExpertHolder", "PrefillDecode", "Prefill", "Decode")
RESIDENCIES = ("Warm", "Cold")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX128 = re.compile(r"^[0-9a-f]{128}$")
_DECIMAL = re.compile(r"^(0|[1-9][0-9]{0,17})(\.[0-9]{1,18})?$")
_BLOB_URI = re.compile(r"^tenzro://blob/[0-9a-f]{64}$")
_CODEC = re.compile(r"^[a-z0-9_]{1,16}$")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$")
NAME_MAX = 64


def is_provider_id(value: str) -> bool:
    """64 lowercase hex digits: an ed25519 public key, which is a provider's id."""
    return bool(_HEX64.match(value))


def is_provider_name(name: str) -> bool:
    """A record's `name`: absent, or 1-64 printable characters (any script) with no space at either end."""
    return name == "" or (len(name) <= NAME_MAX and name.isprintable() and name == name.strip())


class RecordError(InvalidInput):
    """A record or heartbeat that cannot be accepted; `reason` says why (forged, malformed, …)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)


@dataclass(frozen=True)
class Holding:
    model_id: str
    layer: int
    expert: int
    residency: str  # "Warm" | "Cold"
    committed_tps: int  # demand: rows served per wall second over the last minute
    blob_uri: str | None
    capacity_tps: int = 0  # capacity: rows per second of compute (0: not measured yet)

    def to_json(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "layer": self.layer, "expert": self.expert, "residency": self.residency,
                "committed_tps": self.committed_tps, "capacity_tps": self.capacity_tps, "blob_uri": self.blob_uri}


@dataclass(frozen=True)
class ProviderRecord:
    """The fields of a record (what `record` encodes)."""

    provider_id: str
    seq: int
    issued_at_ms: int
    roles: tuple[str, ...]
    http_endpoint: str | None
    quic_endpoint: str | None
    quic_cert_sha256: str | None
    moe_gpu: bool
    price_per_input_token: str  # decimal string: no float ever enters the signed bytes
    holdings: tuple[Holding, ...]
    # Activation codecs its moe/execute accepts, in its order of preference (docs/protocol.md,
    # "Activation codecs"); a record without the field speaks f32 only.
    activation_codecs: tuple[str, ...] = ("f32",)
    # Its moe/execute takes a multi-expert frame (docs/protocol.md, "Multi-expert execute"); a record
    # without the field is a holder that takes one expert per request.
    execute_batches: bool = False
    # A short label its operator chose, for people (dashboards, CLI); never an identity: two
    # providers may share one, and nothing is routed, paid or trusted by it. "" = none given.
    name: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "provider_id": self.provider_id,
            "seq": self.seq,
            "issued_at_ms": self.issued_at_ms,
            "roles": sorted(self.roles),
            "endpoints": {"http": self.http_endpoint, "quic": self.quic_endpoint,
                          "quic_cert_sha256": self.quic_cert_sha256},
            "moe_gpu": self.moe_gpu,
            "price_per_input_token": self.price_per_input_token,
            "moe_holdings": [h.to_json() for h in sorted(self.holdings, key=_holding_key)],
            "activation_codecs": list(self.activation_codecs),
            **({"execute_batches": True} if self.execute_batches else {}),
            **({"name": self.name} if self.name else {}),
        }


@dataclass(frozen=True)
class SignedRecord:
    """A verified (or self-issued) record with the exact text and signature that travel."""

    record: ProviderRecord
    text: str
    signature: str

    @property
    def provider_id(self) -> str:
        return self.record.provider_id

    @property
    def seq(self) -> int:
        return self.record.seq

    @property
    def issued_at_ms(self) -> int:
        return self.record.issued_at_ms

    def envelope(self) -> dict[str, str]:
        return {"record": self.text, "signature": self.signature}

    @property
    def size(self) -> int:
        return len(self.text) + len(self.signature)


@dataclass(frozen=True)
class Heartbeat:
    provider_id: str
    seq: int
    at_ms: int
    signature: str

    def to_json(self) -> dict[str, Any]:
        return {"provider_id": self.provider_id, "seq": self.seq, "at_ms": self.at_ms, "signature": self.signature}


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII; refuses floats (their text is not canonical)."""
    _no_floats(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _no_floats(value: Any) -> None:
    if isinstance(value, float):
        raise ValueError(f"floats are not allowed in signed JSON, got {value!r}")
    if isinstance(value, Mapping):
        for item in value.values():
            _no_floats(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _no_floats(item)


def _holding_key(h: Holding) -> tuple[str, int, int]:
    return h.model_id, h.layer, h.expert


def sign_record(record: ProviderRecord, key: SigningKey) -> SignedRecord:
    """Encode canonically and sign; the key must be the provider's own."""
    if key.verify_key.encode().hex() != record.provider_id:
        raise ValueError("a record is signed by its own provider's key")
    text = canonical_json(record.to_json())
    signature = key.sign(RECORD_DOMAIN + text.encode("ascii")).signature.hex()
    return SignedRecord(record=record, text=text, signature=signature)


def sign_heartbeat(*, provider_id: str, seq: int, at_ms: int, key: SigningKey) -> Heartbeat:
    body = canonical_json({"provider_id": provider_id, "seq": seq, "at_ms": at_ms})
    return Heartbeat(provider_id, seq, at_ms, key.sign(HEARTBEAT_DOMAIN + body.encode("ascii")).signature.hex())


def _verify(provider_id: str, message: bytes, signature: str, what: str) -> None:
    if not isinstance(signature, str) or not _HEX128.match(signature):
        raise RecordError("malformed", f"{what} signature must be 128 lowercase hex digits")
    try:
        VerifyKey(bytes.fromhex(provider_id)).verify(message, bytes.fromhex(signature))
    except (BadSignatureError, ValueError) as exc:
        raise RecordError("forged", f"{what} of provider {provider_id[:16]}… is not signed by its key") from exc


def verify_heartbeat(value: Any) -> Heartbeat:
    """A heartbeat from the wire, its signature checked against its provider id (the key)."""
    if not isinstance(value, Mapping):
        raise RecordError("malformed", "a heartbeat is an object")
    pid, seq, at_ms, sig = (value.get(k) for k in ("provider_id", "seq", "at_ms", "signature"))
    if not (isinstance(pid, str) and _HEX64.match(pid) and _is_count(seq) and _is_count(at_ms)):
        raise RecordError("malformed", "a heartbeat needs provider_id (64 hex), seq and at_ms (integers >= 0)")
    body = canonical_json({"provider_id": pid, "seq": seq, "at_ms": at_ms})
    _verify(pid, HEARTBEAT_DOMAIN + body.encode("ascii"), sig, "heartbeat")
    return Heartbeat(pid, seq, at_ms, sig)


_CLAIMED_ID = re.compile(r'"provider_id":"([0-9a-f]{64})"')


def claimed_provider_id(value: Any) -> str | None:
    """The provider id an envelope's text names, without verifying or parsing it (None if none).

    Canonical text escapes every quote inside strings, so the unescaped `"provider_id":"…"` can
    only be the top-level field; verify_record then checks the signature with exactly this key.
    """
    text = value.get("record") if isinstance(value, Mapping) else None
    match = _CLAIMED_ID.search(text) if isinstance(text, str) else None
    return match.group(1) if match else None


def verify_record(value: Any, *, max_bytes: int) -> SignedRecord:
    """A record envelope from the wire: size, signature (the provider id is the key), then fields.

    The signature is checked on the exact text before the text is parsed, so a forged record
    costs one verify and no parsing. RecordError reasons: oversized, malformed, forged.
    """
    if not isinstance(value, Mapping) or not isinstance(value.get("record"), str):
        raise RecordError("malformed", 'a record envelope is {"record": <text>, "signature": <hex>}')
    text, signature = value["record"], value.get("signature")
    if len(text) > max_bytes:
        raise RecordError("oversized", f"record of {len(text)} bytes exceeds {max_bytes}")
    if not text.isascii():
        raise RecordError("malformed", "record text must be ASCII (canonical JSON escapes the rest)")
    claimed = claimed_provider_id(value)
    if claimed is None:
        raise RecordError("malformed", "record names no provider_id")
    _verify(claimed, RECORD_DOMAIN + text.encode("ascii"), signature, "record")
    try:
        fields = json.loads(text)
    except ValueError as exc:
        raise RecordError("malformed", f"record is not JSON: {exc}") from exc
    record = _parse_record(fields)
    if record.provider_id != claimed:  # the key that signed must be the id the record claims
        raise RecordError("forged", "record names two provider ids")
    return SignedRecord(record=record, text=text, signature=signature)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _parse_record(fields: Any) -> ProviderRecord:
    def bad(why: str) -> RecordError:
        return RecordError("malformed", f"record: {why}")

    if not isinstance(fields, dict) or fields.get("v") != VERSION:
        raise bad(f"must be an object with v = {VERSION}")
    endpoints = fields.get("endpoints")
    roles, holdings = fields.get("roles"), fields.get("moe_holdings")
    if not isinstance(endpoints, dict) or not isinstance(roles, list) or not isinstance(holdings, list):
        raise bad("endpoints (object), roles and moe_holdings (arrays) are required")
    if not all(r in ROLES for r in roles) or len(set(roles)) != len(roles):
        raise bad(f"roles must be distinct values of {ROLES}")
    pid = fields.get("provider_id")
    if not (isinstance(pid, str) and _HEX64.match(pid)):
        raise bad("provider_id must be 64 lowercase hex digits")
    if not (_is_count(fields.get("seq")) and _is_count(fields.get("issued_at_ms"))):
        raise bad("seq and issued_at_ms must be integers >= 0")
    http, quic, pin = endpoints.get("http"), endpoints.get("quic"), endpoints.get("quic_cert_sha256")
    if http is not None and not (isinstance(http, str) and http.startswith(("http://", "https://"))
                                 and len(http) <= 2048):
        raise bad("endpoints.http must be an http(s) URL or null")
    if quic is not None and not (isinstance(quic, str) and _HOST_PORT.match(quic)):
        raise bad("endpoints.quic must be host:port or null")
    if (quic is None) != (pin is None) or (pin is not None and not (isinstance(pin, str) and _HEX64.match(pin))):
        raise bad("endpoints.quic_cert_sha256 must be 64 hex digits exactly when endpoints.quic is set")
    price = fields.get("price_per_input_token")
    if not (isinstance(price, str) and _DECIMAL.match(price)):
        raise bad("price_per_input_token must be a decimal string such as \"0.000002\"")
    if not isinstance(fields.get("moe_gpu"), bool):
        raise bad("moe_gpu must be a boolean")
    codecs = fields.get("activation_codecs", ["f32"])
    if not (isinstance(codecs, list) and 0 < len(codecs) <= 8 and len(set(codecs)) == len(codecs)
            and all(isinstance(c, str) and _CODEC.match(c) for c in codecs)):
        raise bad("activation_codecs must be 1 to 8 distinct codec names such as \"q8_0\"")
    batches = fields.get("execute_batches", False)
    if not isinstance(batches, bool):
        raise bad("execute_batches must be a boolean")
    name = fields.get("name", "")
    if not (isinstance(name, str) and is_provider_name(name)) or ("name" in fields and not name):
        raise bad(f"name must be 1 to {NAME_MAX} printable characters without surrounding spaces")
    return ProviderRecord(
        provider_id=pid, seq=fields["seq"], issued_at_ms=fields["issued_at_ms"], roles=tuple(roles),
        http_endpoint=http, quic_endpoint=quic, quic_cert_sha256=pin, moe_gpu=fields["moe_gpu"],
        price_per_input_token=price, holdings=tuple(_parse_holdings(holdings, bad)),
        activation_codecs=tuple(codecs), execute_batches=batches, name=name,
    )


def _parse_holdings(items: Iterable[Any], bad: Any) -> list[Holding]:
    out: list[Holding] = []
    seen: set[tuple[str, int, int]] = set()
    for item in items:
        if not isinstance(item, dict):
            raise bad("every holding is an object")
        model_id, layer, expert = item.get("model_id"), item.get("layer"), item.get("expert")
        residency, tps, blob_uri = item.get("residency"), item.get("committed_tps"), item.get("blob_uri")
        capacity = item.get("capacity_tps", 0)  # absent in records of nodes that predate it
        if not (isinstance(model_id, str) and 0 < len(model_id) <= 200 and _is_count(layer) and _is_count(expert)
                and residency in RESIDENCIES and _is_count(tps) and _is_count(capacity)
                and (blob_uri is None or (isinstance(blob_uri, str) and _BLOB_URI.match(blob_uri)))):
            raise bad(f"malformed holding {item!r:.200}")
        key = (model_id, layer, expert)
        if key in seen:
            raise bad(f"holding {key} is listed twice")
        seen.add(key)
        out.append(Holding(model_id, layer, expert, residency, tps, blob_uri, capacity))
    return out
