"""Disputes through their service (what the Celery task runs): an honest holder's receipt is
dismissed, a lying holder's is upheld with the policy's fraud penalty, both idempotently; a
receipt whose expert cannot be had stays pending with the reason and is queued again."""

from __future__ import annotations

import numpy as np
import pytest
from django.contrib.auth.models import User
from nacl.signing import SigningKey

from apps.blobs.selectors import blob_store
from apps.blobs.store import BLOB_URI_PREFIX
from apps.forward.report import Failure
from apps.forward.services import forward_outcome_record
from apps.governance.selectors import policy_active
from apps.receipts import services
from apps.receipts.commitment import (
    ReceiptSigner,
    batch_commitment,
    blake3_hex,
    receipt_body,
    sign_receipt,
    sketch_bytes,
)
from apps.receipts.models import Dispute, Receipt
from apps.receipts.selectors import receipts_list
from apps.reputation.selectors import reputation_scores
from core.errors import NotFound, TenzroError
from core.experts.ffn import build_expert, expert_forward
from core.experts.selection import cpu_backend
from core.formats.wire import decode_rows, encode_rows
from tests.experts.factories import expert_payload, expert_weights

pytestmark = pytest.mark.django_db
MODEL, D_MODEL, D_FF = "dispute-test", 64, 32


def _store_expert() -> tuple[bytes, str]:
    payload = expert_payload(expert_weights(np.random.default_rng(1), D_MODEL, D_FF), expert=2, model_id=MODEL,
                             quant="q8_0")
    return payload, BLOB_URI_PREFIX + blob_store().put(payload)


def _kept(key: SigningKey, payload: bytes, blob_uri: str | None, *, lie: float = 1.0, seed: int = 0) -> Receipt:
    """A holder's batch as the router keeps it; `lie` scales the rows it returns (and commits to)."""
    rows = np.random.default_rng(seed).standard_normal((6, D_MODEL)).astype(np.float32)
    carrier = encode_rows(rows, "q8_0")
    backend = cpu_backend()
    out = expert_forward(build_expert(payload, backend), decode_rows(carrier, "q8_0", tokens=6, d_model=D_MODEL),
                         backend) * np.float32(lie)
    answer = encode_rows(out, "q8_0")
    seen = decode_rows(answer, "q8_0", tokens=6, d_model=D_MODEL)
    wire = ReceiptSigner(key)(model_id=MODEL, layer=0, expert=2, token_indices=list(range(10, 16)), d_model=D_MODEL,
                              input_encoding="q8_0", input_carrier=carrier, output_encoding="q8_0", answer=answer,
                              k=16)
    body = {k: v for k, v in wire.items() if k not in ("commitment_hash", "signature")}
    receipt = sign_receipt(body, key)
    services.receipt_record_many(router_id="r" * 64, kept=[{"receipt": receipt, "sketch": sketch_bytes(seen, 16),
                                                            "carrier": carrier, "blob_uri": blob_uri}])
    return Receipt.objects.get(commitment_hash=receipt.commitment_hash)


def test_an_honest_receipt_is_dismissed_and_a_liars_is_upheld_with_the_fraud_penalty(
        django_capture_on_commit_callbacks) -> None:
    payload, uri = _store_expert()
    honest_key, liar_key = SigningKey(bytes([1]) * 32), SigningKey(bytes([2]) * 32)
    honest = _kept(honest_key, payload, uri, seed=1)
    liar = _kept(liar_key, payload, uri, lie=1.3, seed=2)

    with django_capture_on_commit_callbacks() as queued:
        opened = services.dispute_open(receipt_id=honest.pk)
    assert opened.state == "pending" and len(queued) == 1  # the re-execution goes to the Celery worker
    decided = services.dispute_run(dispute_id=opened.pk)
    assert decided.state == "dismissed" and decided.signature_valid
    assert 0 < decided.difference <= decided.tolerance and decided.penalty is None

    with django_capture_on_commit_callbacks() as queued_again:
        assert services.dispute_open(receipt_id=honest.pk).pk == opened.pk  # idempotent: same dispute
    assert queued_again == []  # decided: nothing runs again

    fraud = services.dispute_run(dispute_id=services.dispute_open(receipt_id=liar.pk).pk)
    assert fraud.state == "upheld" and fraud.signature_valid and fraud.difference > fraud.tolerance
    penalty = policy_active().fraud_penalty
    assert fraud.penalty == penalty
    liar_id = liar_key.verify_key.encode().hex()
    assert reputation_scores([liar_id])[liar_id] == pytest.approx(-penalty)
    assert services.dispute_run(dispute_id=fraud.pk).decided_at == fraud.decided_at  # never decided twice
    assert reputation_scores([liar_id])[liar_id] == pytest.approx(-penalty)
    states = {r["commitment_hash"]: r["dispute"] for r in receipts_list(model_id=MODEL)}
    assert states == {honest.commitment_hash: "dismissed", liar.commitment_hash: "upheld"}


def test_a_receipt_without_a_reachable_expert_stays_pending_with_its_reason(
        django_capture_on_commit_callbacks) -> None:
    payload, _ = _store_expert()
    receipt = _kept(SigningKey(bytes([3]) * 32), payload, None)
    dispute = services.dispute_open(receipt_id=receipt.pk)
    with pytest.raises(TenzroError) as caught:
        services.dispute_run(dispute_id=dispute.pk)
    assert caught.value.reason == "expert_unavailable"
    dispute.refresh_from_db()
    assert dispute.state == "pending" and "expert_unavailable" in dispute.error and dispute.attempts == 1
    with django_capture_on_commit_callbacks() as queued:
        services.dispute_open(receipt_id=receipt.pk)
    assert len(queued) == 1  # asked again: queued again
    with pytest.raises(NotFound):
        services.dispute_open(receipt_id=10**9)


def test_a_kept_receipt_is_stored_once_with_what_a_dispute_needs() -> None:
    payload, uri = _store_expert()
    key = SigningKey(bytes([4]) * 32)
    receipt = _kept(key, payload, uri)
    again = receipt_body(**{**{k: receipt.body[k] for k in ("model_id", "layer", "expert", "token_indices",
                                                             "d_model", "input_encoding", "output_encoding", "k")},
                            "provider_id": key.verify_key.encode().hex(), "input_carrier": bytes(receipt.carrier),
                            "sketch": bytes(receipt.sketch)})
    assert again == receipt.body and blake3_hex(bytes(receipt.carrier)) == receipt.body["input_hash"]
    assert Dispute.objects.count() == 0 and Receipt.objects.count() == 1


def test_admin_pages_show_receipts_and_disputes_read_only(client) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    payload, uri = _store_expert()
    receipt = _kept(SigningKey(bytes([5]) * 32), payload, uri)
    dispute = services.dispute_open(receipt_id=receipt.pk)
    for url in ("/admin/receipts/receipt/", "/admin/receipts/dispute/", f"/admin/receipts/receipt/{receipt.pk}/change/",
                f"/admin/receipts/dispute/{dispute.pk}/change/"):
        assert client.get(url).status_code == 200, url
    detail = client.get(f"/admin/receipts/receipt/{receipt.pk}/change/").content.decode()
    assert receipt.commitment_hash in detail and 'name="_save"' not in detail
    assert client.get("/admin/receipts/receipt/add/").status_code == 403
    assert client.post(f"/admin/receipts/receipt/{receipt.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Receipt.objects.filter(pk=receipt.pk).exists()


def test_a_holder_refused_for_its_receipt_loses_the_policys_failure_penalty() -> None:
    liar = "c" * 64
    forward_outcome_record(model_id=MODEL, self_id="r" * 64, latencies_ms={}, failures=[
        Failure(liar, "bad_receipt", "the receipt is over different input than was sent", 0, 2, 6),
        Failure(liar, "receipt_missing", "answered without a receipt", 0, 3, 6)])
    assert reputation_scores([liar])[liar] == pytest.approx(-2 * policy_active().holder_failure_penalty)

def _kept_from_batches(key: SigningKey, payload: bytes, blob_uri: str, *, lie: float = 1.0) -> Receipt:
    """Batch 1 (expert 2) of a multi-expert answer, kept as the router keeps it: the whole carrier, the
    one v2 receipt, that batch's sketch and commitment. Expert 2's rows are scaled by `lie` before the
    holder commits to them; the other batch (a stand-in expert 5) is honest noise."""
    carrier_rows = np.random.default_rng(7).standard_normal((5, D_MODEL)).astype(np.float32)
    carrier = encode_rows(carrier_rows, "q8_0")
    rows_of_2 = [0, 2, 3]
    backend = cpu_backend()
    hidden = decode_rows(carrier, "q8_0", tokens=5, d_model=D_MODEL)[rows_of_2]
    out = expert_forward(build_expert(payload, backend), hidden, backend) * np.float32(lie)
    answer_2 = encode_rows(out, "q8_0")
    answer_5 = encode_rows(np.ones((2, D_MODEL), np.float32), "q8_0")
    wire = ReceiptSigner(key).batches(model_id=MODEL, layer=0, token_indices=[3, 4, 8, 9, 11], d_model=D_MODEL,
                                      input_encoding="q8_0", input_carrier=carrier, output_encoding="q8_0", k=16,
                                      batches=[(5, [1, 4], answer_5), (2, rows_of_2, answer_2)])
    body = {k: v for k, v in wire.items() if k not in ("commitment_hash", "signature")}
    receipt = sign_receipt(body, key)
    commitment = batch_commitment(receipt.commitment_hash, 1)
    seen = decode_rows(answer_2, "q8_0", tokens=3, d_model=D_MODEL)
    services.receipt_record_many(router_id="r" * 64, kept=[{
        "receipt": receipt, "sketch": sketch_bytes(seen, 16), "carrier": carrier, "blob_uri": blob_uri,
        "commitment": commitment, "batch": 1}])
    return Receipt.objects.get(commitment_hash=commitment)


def test_a_batch_kept_from_a_multi_expert_request_is_disputed_on_its_own() -> None:
    payload, uri = _store_expert()
    honest_key, liar_key = SigningKey(bytes([5]) * 32), SigningKey(bytes([6]) * 32)
    honest = _kept_from_batches(honest_key, payload, uri)
    liar = _kept_from_batches(liar_key, payload, uri, lie=1.3)
    assert (honest.expert, honest.tokens, honest.batch, honest.layer) == (2, 3, 1, 0)
    dismissed = services.dispute_run(dispute_id=services.dispute_open(receipt_id=honest.pk).pk)
    assert dismissed.state == "dismissed" and dismissed.signature_valid
    upheld = services.dispute_run(dispute_id=services.dispute_open(receipt_id=liar.pk).pk)
    assert upheld.state == "upheld" and upheld.signature_valid and upheld.difference > upheld.tolerance
    liar_id = liar_key.verify_key.encode().hex()
    assert reputation_scores([liar_id])[liar_id] == pytest.approx(-policy_active().fraud_penalty)


def test_a_kept_batch_under_another_batchs_commitment_is_no_fraud_proof() -> None:
    """The stored commitment must be this batch's: a row filed under batch 0's commitment with batch 1's
    sketch proves nothing against the holder, so even a real mismatch is dismissed as unsigned."""
    payload, uri = _store_expert()
    kept = _kept_from_batches(SigningKey(bytes([7]) * 32), payload, uri, lie=1.3)
    Receipt.objects.filter(pk=kept.pk).update(batch=0)
    decided = services.dispute_run(dispute_id=services.dispute_open(receipt_id=kept.pk).pk)
    assert decided.state == "dismissed" and decided.signature_valid is False


def test_kept_receipts_are_pruned_by_age_and_count_but_a_disputed_one_stays(settings) -> None:
    import datetime

    from django.utils import timezone

    payload, uri = _store_expert()
    key = SigningKey(bytes([3]) * 32)
    kept = [_kept(key, payload, uri, seed=s) for s in range(5)]
    now = timezone.now()
    for age, receipt in zip((40, 35, 2, 1, 0), kept, strict=True):  # days old
        Receipt.objects.filter(pk=receipt.pk).update(created_at=now - datetime.timedelta(days=age))
    services.dispute_open(receipt_id=kept[0].pk)  # evidence: kept whatever its age
    settings.TENZRO_RECEIPT_RETENTION_DAYS, settings.TENZRO_RECEIPT_KEEP_MAX = 30, 2
    assert services.receipts_prune(now=now) == 2  # the 35-day-old one, then the oldest past the newest two
    assert sorted(Receipt.objects.values_list("pk", flat=True)) == sorted([kept[0].pk, kept[3].pk, kept[4].pk])
    assert services.receipts_prune(now=now) == 0
