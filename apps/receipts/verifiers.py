"""A second opinion on a kept batch: another holder of the same blob re-executes it (`receipt/verify`).

A router that has no copy of a disputed expert asks up to TENZRO_DISPUTE_VERIFIERS other holders
that announce the exact blob the accused holder announced (never the accused), in random order so
that no holder can count on being the one asked, over QUIC pinned to their records, else over
their HTTP door. The first verdict that verifies (apps/receipts/evidence.verify_verdict: the asked
holder's signature over exactly this batch, the worst row it names) is the answer; a holder that
refuses, fails or answers a verdict that does not verify is passed over, and named in the dispute.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from django.conf import settings

from apps.blobs.peers import PeerBlobEndpoint, blob_holders
from apps.blobs.store import parse_blob_uri
from apps.node.selectors import node_identity
from apps.receipts.commitment import ReceiptError, blake3_hex, canonical_text
from apps.receipts.evidence import verify_verdict
from apps.receipts.models import Receipt
from core.env import split_host_port
from core.transport.framing import FRAME_CONTENT_TYPE, KIND_RESPONSE, FramingError, decode_frame, request_frame
from core.transport.quic import QuicSettings, TransportError, quic_call

logger = logging.getLogger("tenzro.receipts")
METHOD = "receipt/verify"


@dataclass(frozen=True)
class SecondOpinion:
    verifier_id: str
    verdict: dict[str, Any]  # as it came, signature included (verified)
    worst_row: np.ndarray  # f32 [d_model] the verifier recomputed where it measured (empty: no rows)


def verifier_endpoints(receipt: Receipt) -> list[PeerBlobEndpoint]:
    """Up to TENZRO_DISPUTE_VERIFIERS holders announcing the receipt's blob, the accused and this node aside."""
    if not receipt.blob_uri or settings.TENZRO_DISPUTE_VERIFIERS <= 0:
        return []
    me = node_identity().provider_id
    holders = [h for h in blob_holders(parse_blob_uri(receipt.blob_uri))
               if h.announces and h.provider_id and h.provider_id not in (receipt.provider_id, me)]
    random.shuffle(holders)
    return holders[:settings.TENZRO_DISPUTE_VERIFIERS]


def request_of(receipt: Receipt) -> tuple[dict[str, Any], bytes]:
    """receipt/verify's params and body for a kept batch (docs/protocol.md, "Disputes by another holder")."""
    body = receipt.body
    wire = {**body, "commitment_hash": blake3_hex(canonical_text(body).encode("ascii")),
            "signature": receipt.signature}
    return ({"receipt": wire, "batch": receipt.batch, "blob_uri": receipt.blob_uri},
            bytes(receipt.carrier) + bytes(receipt.sketch))


def _call(endpoint: PeerBlobEndpoint, params: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
    """One receipt/verify call: QUIC pinned, else the HTTP door; RuntimeError saying why both failed."""
    timeout = settings.TENZRO_DISPUTE_VERIFY_TIMEOUT_S
    failures = []
    if endpoint.quic_endpoint and endpoint.quic_cert_sha256:
        host, port = split_host_port(endpoint.quic_endpoint, what="quic endpoint")
        try:
            result, answer = asyncio.run(quic_call(
                host=host, port=port, pin_sha256=endpoint.quic_cert_sha256, method=METHOD, params=params, body=body,
                settings=QuicSettings(max_body=settings.TENZRO_QUIC_MAX_BODY), timeout_s=timeout))
            return result, bytes(answer)
        except TransportError as exc:
            if exc.reason not in ("timeout", "connection_failed", "connection_closed", "stream_reset",
                                  "certificate_pin_mismatch"):
                raise RuntimeError(f"{exc.reason}: {exc}") from exc  # it answered: its refusal is the answer
            failures.append(f"quic: {exc.reason}: {exc}")
    if endpoint.http_endpoint:
        try:
            answer = httpx.post(f"{endpoint.http_endpoint.rstrip('/')}/peer/{METHOD}", timeout=timeout,
                                content=request_frame(METHOD, params, body),
                                headers={"Content-Type": FRAME_CONTENT_TYPE})
            frame = decode_frame(answer.content, kind=KIND_RESPONSE, max_body=settings.TENZRO_QUIC_MAX_BODY)
        except (httpx.HTTPError, FramingError) as exc:
            failures.append(f"http: {exc}")
        else:
            if frame.header.get("ok"):
                return frame.header.get("result") or {}, bytes(frame.body)
            error = frame.header.get("error") or {}
            raise RuntimeError(f"{error.get('reason')}: {error.get('message')}")
    raise RuntimeError("; ".join(failures) or "no QUIC or HTTP door in its record")


def second_opinion(receipt: Receipt) -> tuple[SecondOpinion | None, list[str]]:
    """The first verified verdict of another holder, and what each holder passed over said."""
    passed: list[str] = []
    params, body = request_of(receipt)
    for endpoint in verifier_endpoints(receipt):
        verifier = str(endpoint.provider_id)
        try:
            result, row = _call(endpoint, params, body)
            verdict = verify_verdict(result.get("verdict"), verifier_id=verifier, provider_id=receipt.provider_id,
                                     commitment=receipt.commitment_hash, model_id=receipt.model_id,
                                     layer=receipt.layer, expert=receipt.expert, blob_uri=str(receipt.blob_uri),
                                     worst_row=row)
            if len(row) not in (0, 4 * receipt.body["d_model"]):
                raise ReceiptError(f"the verdict's worst row has {len(row)} bytes", reason="bad_verdict")
        except (RuntimeError, ReceiptError) as exc:
            logger.info("verifier %s… passed over for receipt %s: %s", verifier[:16], receipt.commitment_hash[:16], exc)
            passed.append(f"verifier {verifier[:16]}… passed over ({exc})")
            continue
        return SecondOpinion(verifier, verdict, np.frombuffer(row, dtype="<f4").astype(np.float32)), passed
    return None, passed
