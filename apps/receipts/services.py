"""Writes of receipts and disputes.

* `receipt_record_many`: the batches a forward's sampling kept, persisted in full.
* `dispute_open`: idempotent; opens (or returns) the dispute of a receipt and queues its
  re-execution after commit.
* `dispute_run`: the Celery task's service: without a copy of the expert of its own, ask another
  holder of the same blob for a signed verdict (apps/receipts/verifiers.py); then, unless that
  verdict dismisses, re-execute the stored request against a local copy of the expert (its blob,
  from this node's store or fetched from a peer and verified by hash), compare with the committed
  sketch, record the verdict; an upheld one is a fraud proof (the signature verifies, this node's
  own recomputation does not match) and takes the policy's fraud penalty.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.blobs.peers import blob_holders
from apps.blobs.resolver import HttpBlobSource, resolve_blob
from apps.blobs.selectors import blob_store
from apps.blobs.store import BlobError, parse_blob_uri
from apps.governance.selectors import policy_active
from apps.receipts.commitment import (
    SignedReceipt,
    batch_commitment,
    blake3_hex,
    canonical_text,
    signature_valid,
    sketch_rows,
)
from apps.receipts.models import Dispute, DisputeState, Receipt
from apps.receipts.selectors import receipts_list
from apps.receipts.signals import dispute_decided, receipts_kept
from apps.receipts.verdict import Comparison, compare_sketch
from apps.receipts.verifiers import SecondOpinion, second_opinion
from apps.reputation.services import reputation_penalize
from core import metrics
from core.errors import NotFound, TenzroError
from core.experts.ffn import build_expert, expert_forward
from core.experts.selection import cpu_backend
from core.formats.wire import decode_rows

logger = logging.getLogger("tenzro.receipts")
DISPUTE_TASK = "tenzro.receipts.dispute_run"


def receipt_record_many(*, router_id: str, kept: Iterable[dict[str, Any]]) -> int:
    """Persist kept batches: each {receipt: SignedReceipt, sketch, carrier, blob_uri, and for batch
    `batch` of a multi-expert receipt its `commitment`}. A commitment already stored (the same batch
    kept twice) is left as it is. Returns how many were new."""
    rows = []
    for item in kept:
        receipt: SignedReceipt = item["receipt"]
        body, batch = receipt.body, item.get("batch")
        expert, rows_of = batch_of(body, batch)
        rows.append(Receipt(commitment_hash=item.get("commitment") or receipt.commitment_hash, router_id=router_id,
                            provider_id=body["provider_id"], model_id=body["model_id"], layer=body["layer"],
                            expert=expert, tokens=len(rows_of), body=body, batch=batch,
                            signature=receipt.signature, sketch=item["sketch"], carrier=item["carrier"],
                            blob_uri=item.get("blob_uri")))
    hashes = [row.commitment_hash for row in rows]
    known = set(Receipt.objects.filter(commitment_hash__in=hashes).values_list("commitment_hash", flat=True))
    Receipt.objects.bulk_create([row for row in rows if row.commitment_hash not in known], ignore_conflicts=True)
    new = [h for h in hashes if h not in known]
    if new:
        transaction.on_commit(lambda: receipts_kept.send(sender=Receipt, receipts=[
            {**row, "created_at": row["created_at"].isoformat()} for row in receipts_list(commitment_hashes=new)]))
    return len(new)


def receipts_prune(*, now: datetime.datetime | None = None) -> int:
    """Forget kept receipts older than TENZRO_RECEIPT_RETENTION_DAYS, and beyond the newest
    TENZRO_RECEIPT_KEEP_MAX; a receipt under a dispute is evidence and stays. Returns how many went."""
    now = now or timezone.now()
    undisputed = Receipt.objects.filter(dispute__isnull=True)
    old = undisputed.filter(created_at__lt=now - datetime.timedelta(days=settings.TENZRO_RECEIPT_RETENTION_DAYS))
    gone = old.delete()[0]
    extra = list(undisputed.order_by("-created_at", "-id").values_list("id", flat=True)
                 [settings.TENZRO_RECEIPT_KEEP_MAX:])
    for start in range(0, len(extra), 5000):  # bounded IN lists
        gone += Receipt.objects.filter(id__in=extra[start:start + 5000]).delete()[0]
    if gone:
        logger.info("pruned %d kept receipts (older than %s days or past the newest %d)", gone,
                    settings.TENZRO_RECEIPT_RETENTION_DAYS, settings.TENZRO_RECEIPT_KEEP_MAX)
    return gone


def dispute_open(*, receipt_id: int) -> Dispute:
    """The receipt's dispute, opened on the first call; later calls return the same one. A pending
    dispute whose last re-execution could not run (its error says why) is queued again."""
    with transaction.atomic():
        receipt = Receipt.objects.select_for_update().filter(pk=receipt_id).first()
        if receipt is None:
            raise NotFound(f"no stored receipt {receipt_id} on this node", reason="receipt_not_found")
        dispute, created = Dispute.objects.get_or_create(receipt=receipt)
        if created or (dispute.state == DisputeState.PENDING and dispute.error):
            def queue() -> None:
                # By the task's registered name: tasks.py imports this module, so importing it back would make
                # a cycle.
                current_app.send_task(DISPUTE_TASK, args=[dispute.pk])
                if created:
                    metrics.DISPUTES.labels("opened").inc()

            transaction.on_commit(queue)
    return dispute


def _expert_payload(receipt: Receipt) -> bytes:
    """The expert's weights as the holder advertised them: its blob, verified by hash."""
    if not receipt.blob_uri:
        raise TenzroError(f"the holder announced {receipt.model_id} {receipt.layer}/{receipt.expert} without a "
                          "blob_uri, and this node holds no copy to re-execute with", reason="expert_unavailable")
    hash_ = parse_blob_uri(receipt.blob_uri)
    urls = dict.fromkeys([*(h.http_endpoint for h in blob_holders(hash_) if h.http_endpoint),
                          *settings.TENZRO_PEERS])
    try:
        return resolve_blob(blob_store(), hash_, sources=[HttpBlobSource(u) for u in urls],
                            max_bytes=settings.TENZRO_BLOB_MAX_BYTES).data
    except BlobError as exc:
        raise TenzroError(f"cannot fetch {receipt.blob_uri}: {exc}", reason="expert_unavailable") from exc


def batch_of(body: dict[str, Any], batch: int | None) -> tuple[int, list[int]]:
    """(expert, its rows' positions in the carrier) of a kept batch: the whole carrier of a
    single-expert receipt, or entry `batch` of a multi-expert one."""
    if batch is None:
        return body["expert"], list(range(len(body["token_indices"])))
    entry = body["batches"][batch]
    return entry["expert"], entry["rows"]


def recompute(receipt: Receipt) -> np.ndarray:
    """The stored request's batch through a local copy of the expert: f32 [tokens, d_model]."""
    body = receipt.body
    hidden = decode_rows(bytes(receipt.carrier), body["input_encoding"], tokens=len(body["token_indices"]),
                         d_model=body["d_model"])[batch_of(body, receipt.batch)[1]]
    # the CPU backend, whatever the worker runs: a dispute re-executes in a Celery worker, where
    # opening a GPU per task would cost seconds and device memory the expert worker budgets
    backend = cpu_backend()
    expert = build_expert(_expert_payload(receipt), backend)
    if expert.key != (receipt.model_id, receipt.layer, receipt.expert):
        raise TenzroError(f"{receipt.blob_uri} holds expert {expert.key}, the receipt names "
                          f"{(receipt.model_id, receipt.layer, receipt.expert)}", reason="model_mismatch")
    return expert_forward(expert, hidden, backend)


def _signed_commitment(receipt: Receipt) -> bool:
    """The holder's signature verifies over the stored body, the body commits to the stored sketch, and
    the stored commitment is this batch's: what makes a mismatch a fraud proof."""
    body = receipt.body
    signed_hash = blake3_hex(canonical_text(body).encode("ascii"))
    if receipt.batch is None:
        sketch_hash, commitment = body.get("sketch_hash"), signed_hash
    else:
        sketch_hash, commitment = body["batches"][receipt.batch]["sketch_hash"], batch_commitment(signed_hash,
                                                                                                receipt.batch)
    return (commitment == receipt.commitment_hash and sketch_hash == blake3_hex(bytes(receipt.sketch))
            and signature_valid(SignedReceipt(body, signed_hash, receipt.signature)))


def _local_copy(receipt: Receipt) -> bool:
    """This node's blob store holds the expert the holder announced (it holds the expert, or did)."""
    try:
        return bool(receipt.blob_uri) and blob_store().has(parse_blob_uri(str(receipt.blob_uri)))
    except BlobError:
        return False


@dataclass(frozen=True)
class _Decision:
    comparison: Comparison
    opinion: SecondOpinion | None
    reexecuted_here: bool
    note: str  # what the other holders said, for the dispute's detail


def _decide(receipt: Receipt) -> _Decision:
    """The comparison a dispute is decided on. Without a copy of its own, this node asks other holders of
    the blob first: a verdict that dismisses is taken as it is (recorded, signed by its verifier; nothing
    is penalized on it); one that upholds is evidence, not authority: this node then re-executes the
    batch itself, and only its own recomputation can uphold the dispute. TenzroError: it could not."""
    body = receipt.body
    opinion, passed = (None, []) if _local_copy(receipt) else second_opinion(receipt)
    note = "".join(f"; {p}" for p in passed)
    if opinion is not None and not opinion.verdict["upheld"]:
        v = opinion.verdict
        return _Decision(Comparison(False, v["difference_ppm"] / 1e6, v["tolerance_ppm"] / 1e6, v["worst_row"],
                                    f"re-executed by holder {opinion.verifier_id[:16]}…: row {v['worst_row']} differs "
                                    f"by {v['difference_ppm'] / 1e6:.4g} of the row's scale (tolerance "
                                    f"{v['tolerance_ppm'] / 1e6:.4g})"), opinion, False, note)
    recomputed = recompute(receipt)
    indices, values = sketch_rows(bytes(receipt.sketch), tokens=receipt.tokens, k=body["k"])
    comparison = compare_sketch(indices, values, recomputed, output_encoding=body["output_encoding"],
                                compute_tolerance=settings.TENZRO_DISPUTE_COMPUTE_TOLERANCE)
    if opinion is not None:
        row = opinion.verdict["worst_row"]
        ours = recomputed[row] if 0 <= row < len(recomputed) else np.zeros(0, np.float32)
        scale = max(float(np.abs(ours).max(initial=0.0)), float(np.finfo(np.float32).tiny))
        tolerance = settings.TENZRO_DISPUTE_COMPUTE_TOLERANCE
        same = ours.shape == opinion.worst_row.shape and \
            float(np.abs(ours - opinion.worst_row).max(initial=0.0)) / scale <= tolerance
        if comparison.upheld and same:
            note += f"; holder {opinion.verifier_id[:16]}… found the same"
        else:
            note += (f"; holder {opinion.verifier_id[:16]}…'s upheld verdict was not confirmed here (its row "
                     f"{row} {'matches' if same else 'differs from'} this node's recomputation)")
            logger.warning("holder %s upheld a dispute of receipt %s that this node's own re-execution %s",
                           opinion.verifier_id[:16], receipt.commitment_hash[:16],
                           "upholds with another row" if comparison.upheld else "dismisses")
    return _Decision(comparison, opinion, True, note)


def dispute_run(*, dispute_id: int) -> Dispute:
    """Re-execute (or have another holder re-execute) and decide. Runs at most once to a verdict: a decided
    dispute is returned as is."""
    dispute = Dispute.objects.select_related("receipt").get(pk=dispute_id)
    if dispute.state != DisputeState.PENDING:
        return dispute
    receipt = dispute.receipt
    Dispute.objects.filter(pk=dispute_id).update(attempts=dispute.attempts + 1)
    try:
        decision = _decide(receipt)
    except TenzroError as exc:
        Dispute.objects.filter(pk=dispute_id).update(error=f"{exc.reason}: {exc.message}")
        raise
    verdict = decision.comparison
    signed = _signed_commitment(receipt)
    # A fraud proof needs both halves: the holder's own signature over the commitment, and a
    # recomputation that does not match it. Without the signature nothing binds the holder.
    upheld = verdict.upheld and signed and decision.reexecuted_here
    with transaction.atomic():
        locked = Dispute.objects.select_for_update().get(pk=dispute_id)
        if locked.state != DisputeState.PENDING:
            return locked  # a concurrent run decided first
        locked.state = DisputeState.UPHELD if upheld else DisputeState.DISMISSED
        locked.difference = verdict.difference if np.isfinite(verdict.difference) else None
        locked.tolerance = verdict.tolerance
        locked.detail = verdict.detail + decision.note + ("" if signed else "; the receipt's signature does not verify")
        locked.signature_valid = signed
        locked.error = ""
        locked.decided_at = timezone.now()
        locked.reexecuted_here = decision.reexecuted_here
        if decision.opinion is not None:
            locked.verifier_id, locked.verdict = decision.opinion.verifier_id, decision.opinion.verdict
        if upheld:
            penalty = policy_active().fraud_penalty
            locked.penalty = penalty
            reputation_penalize(provider_id=receipt.provider_id, amount=Decimal(str(penalty)), reason="fraud",
                                ref=f"dispute:{locked.pk}", fraud=True)
        locked.save()
        decided = {"receipt_id": receipt.pk, "dispute_id": locked.pk, "state": locked.state,
                   "difference": locked.difference, "tolerance": locked.tolerance}
        def announce() -> None:
            dispute_decided.send(sender=Dispute, **decided)
            metrics.DISPUTES.labels("upheld" if upheld else "dismissed").inc()

        transaction.on_commit(announce)
    logger.info("dispute %s of receipt %s: %s (%s)", dispute_id, receipt.commitment_hash[:16], locked.state,
                locked.detail)
    return locked
