"""Multi-expert receipts (v2): one signature over every batch of a holder's layer step, each batch
still committed, sampled and disputable on its own. Pure: no Django, no transport."""

from __future__ import annotations

import numpy as np
import pytest
from nacl.signing import SigningKey

from apps.receipts.commitment import (
    BATCHES_DOMAIN,
    ExpectedBatches,
    ReceiptError,
    ReceiptSigner,
    SignedReceipt,
    batch_commitment,
    blake3_hex,
    canonical_text,
    signature_valid,
    verify_batches_receipt,
)
from core.formats.wire import decode_rows, encode_rows

D_MODEL, K = 64, 8
KEY = SigningKey(bytes(range(32)))
SIGNER = ReceiptSigner(KEY)


def _request(codec: str, rng: np.random.Generator) -> tuple[bytes, list[int], list[tuple[int, list[int]]],
                                                            list[bytes]]:
    """(carrier, token_indices, batches [(expert, rows)], each batch's answer as encoded)."""
    carrier = encode_rows(rng.standard_normal((5, D_MODEL)).astype(np.float32), codec)
    tokens = [0, 3, 4, 7, 9]
    batches = [(2, [0, 1, 4]), (5, [1, 2]), (11, [3])]
    answers = [encode_rows(rng.standard_normal((len(rows), D_MODEL)).astype(np.float32), codec) for _, rows in batches]
    return carrier, tokens, batches, answers


def _signed(codec: str, rng: np.random.Generator) -> tuple[dict, ExpectedBatches, list]:
    carrier, tokens, batches, answers = _request(codec, rng)
    wire = SIGNER.batches(model_id="m", layer=3, token_indices=tokens, d_model=D_MODEL, input_encoding=codec,
                          input_carrier=carrier, output_encoding=codec, k=K,
                          batches=[(e, rows, a) for (e, rows), a in zip(batches, answers, strict=True)])
    expect = ExpectedBatches(SIGNER.provider_id, "m", 3, tokens, D_MODEL, codec, blake3_hex(carrier), codec, K,
                             batches)
    outs = [(decode_rows(a, codec, tokens=len(rows), d_model=D_MODEL), a)
            for a, (_, rows) in zip(answers, batches, strict=True)]
    return wire, expect, outs


@pytest.mark.parametrize("codec", ["q8_0", "f32"])
def test_one_receipt_over_several_experts_verifies_with_one_signature(codec) -> None:
    wire, expect, outs = _signed(codec, np.random.default_rng(1))
    receipt, sketches = verify_batches_receipt(wire, expect, outs)
    assert receipt.body["v"] == 2 and [b["expert"] for b in receipt.body["batches"]] == [2, 5, 11]
    assert [b["sketch_hash"] for b in receipt.body["batches"]] == [blake3_hex(s) for s in sketches]
    assert signature_valid(receipt)
    # the signature is over the v2 domain, not v1's: a v1 verifier cannot be fooled into a v2 body
    KEY.verify_key.verify(BATCHES_DOMAIN + canonical_text(receipt.body).encode(), bytes.fromhex(receipt.signature))
    commitments = [batch_commitment(receipt.commitment_hash, i) for i in range(3)]
    assert len(set(commitments)) == 3 and receipt.commitment_hash not in commitments


@pytest.mark.parametrize("codec", ["q8_0", "f32"])
@pytest.mark.parametrize("batch", [0, 1, 2])
def test_a_tampered_row_of_any_one_expert_fails_the_receipt_naming_it(codec, batch) -> None:
    wire, expect, outs = _signed(codec, np.random.default_rng(2))
    rows, _ = outs[batch]
    tampered = rows.copy()
    tampered[0, int(np.argmax(np.abs(tampered[0])))] *= 2.0  # the row's largest feature: in every sketch
    outs[batch] = (tampered, encode_rows(tampered, codec))
    expert = expect.batches[batch][0]
    with pytest.raises(ReceiptError, match=f"expert {expert} does not match the returned rows"):
        verify_batches_receipt(wire, expect, outs)


def _altered(name: str, wire: dict, expect: ExpectedBatches) -> tuple[dict | None, ExpectedBatches]:
    fields = expect.__dict__
    if name == "forged signature":
        body = {k: v for k, v in wire.items() if k not in ("commitment_hash", "signature")}
        other = SigningKey(bytes(32)).sign(BATCHES_DOMAIN + canonical_text(body).encode()).signature.hex()
        return {**wire, "signature": other}, expect
    if name == "v1 body":
        return {**wire, "v": 1}, expect
    if name == "missing":
        return None, expect
    changed = {"another provider": {"provider_id": "ab" * 32}, "another layer": {"layer": 4},
               "another token set": {"token_indices": [0, 3, 4, 7, 8]}, "other input": {"input_hash": "0" * 64},
               "batches reordered": {"batches": [expect.batches[1], expect.batches[0], expect.batches[2]]},
               "a batch's rows": {"batches": [(2, [0, 1, 3]), *expect.batches[1:]]},
               "a batch left out": {"batches": expect.batches[:2]}}[name]
    return wire, ExpectedBatches(**{**fields, **changed})


@pytest.mark.parametrize("name", ["another provider", "another layer", "another token set", "other input",
                                  "batches reordered", "a batch's rows", "a batch left out", "v1 body",
                                  "forged signature", "missing"])
def test_every_field_and_every_batch_entry_is_checked(name) -> None:
    wire, expect, outs = _signed("q8_0", np.random.default_rng(3))
    wire, expect = _altered(name, wire, expect)
    with pytest.raises(ReceiptError):
        verify_batches_receipt(wire, expect, outs[:len(expect.batches)])


def test_a_kept_batchs_commitment_binds_the_signed_body() -> None:
    wire, expect, outs = _signed("f32", np.random.default_rng(4))
    receipt, _ = verify_batches_receipt(wire, expect, outs)
    forged = SignedReceipt({**receipt.body, "layer": 9}, receipt.commitment_hash, receipt.signature)
    assert signature_valid(receipt) and not signature_valid(forged)
