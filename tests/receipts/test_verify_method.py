"""Disputes by another holder (docs/protocol.md, "Disputes by another holder"): a kept batch is evidence only
when the holder's signature binds every part of it; a verifier that holds the same blob re-executes it
and signs a verdict the router can check; what a verifier does for a peer is bounded."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from nacl.signing import SigningKey

from apps.receipts.commitment import ReceiptError, ReceiptSigner, blake3_hex, sketch_bytes
from apps.receipts.evidence import kept_batch, verify_verdict
from apps.receipts.verify_method import VerifyMethod
from apps.worker.doors import CallContext, Door
from apps.worker.expert_methods import ExpertHandlers
from core.errors import TenzroError
from core.experts.runtime import ExpertRuntime
from core.formats.wire import decode_rows, encode_rows
from tests.experts.factories import expert_payload, expert_weights

MODEL, D_MODEL, D_FF = "verify-test", 64, 32
HOLDER, VERIFIER = SigningKey(bytes([7]) * 32), SigningKey(bytes([9]) * 32)
URI = "tenzro://blob/" + "ab" * 32
PEER = CallContext(door=Door.PEER, peer=("192.0.2.1", 4433))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def holder_and_verifier(tmp_path_factory):
    """A holder (signs receipts) and a verifier holding the same two experts from the blob URI."""
    rng = np.random.default_rng(5)
    payloads = [expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=e, model_id=MODEL, quant="q8_0")
                for e in (0, 1)]
    holder = ExpertRuntime(data_dir=tmp_path_factory.mktemp("holder"), memory_budget_bytes=1 << 26)
    verifier = ExpertRuntime(data_dir=tmp_path_factory.mktemp("verifier"), memory_budget_bytes=1 << 26)
    for e, payload in enumerate(payloads):
        holder.expert_load(payload=payload)
        verifier.expert_load(payload=payload, blob_uri=URI if e == 0 else URI.replace("ab", "cd"))
    with ThreadPoolExecutor(2) as executor:
        handlers = ExpertHandlers(runtime=holder, executor=executor, max_payload_bytes=1 << 20,
                                  sign_receipt=ReceiptSigner(HOLDER))
        yield handlers, verifier, executor


def verify_method(verifier, executor, clock=None, rate: int = 100, max_rows: int = 64) -> VerifyMethod:
    return VerifyMethod(runtime=verifier, executor=executor, signing_key=VERIFIER, compute_tolerance=0.05,
                        max_rows=max_rows, rate_per_min=rate, clock=clock or Clock())


def kept_single(handlers, *, lie: float = 1.0, seed: int = 0) -> tuple[dict, bytes, bytes]:
    """A holder's single-expert answer as a router keeps it: the receipt as it came, the carrier, the sketch
    of the rows it returned (scaled by `lie`, which the holder signs all the same)."""
    rows = np.random.default_rng(seed).standard_normal((5, D_MODEL)).astype(np.float32)
    carrier = encode_rows(rows, "q8_0")
    params = {"model_id": MODEL, "layer": 0, "expert": 0, "d_model": D_MODEL, "tokens": 5, "encoding": "q8_0"}
    _, out = asyncio.run(handlers.execute(params, carrier, PEER))
    answer = decode_rows(out, "q8_0", tokens=5, d_model=D_MODEL) * np.float32(lie)
    signer = ReceiptSigner(HOLDER)
    encoded = encode_rows(answer, "q8_0")
    wire = signer(model_id=MODEL, layer=0, expert=0, token_indices=list(range(5)), d_model=D_MODEL,
                  input_encoding="q8_0", input_carrier=carrier, output_encoding="q8_0", answer=encoded, k=16)
    return wire, carrier, sketch_bytes(decode_rows(encoded, "q8_0", tokens=5, d_model=D_MODEL), 16)


def ask(method: VerifyMethod, wire: dict, carrier: bytes, sketch: bytes, *, batch=None, uri: str = URI,
        ctx: CallContext = PEER) -> tuple[dict, bytes]:
    return asyncio.run(method.verify({"receipt": wire, "batch": batch, "blob_uri": uri}, carrier + sketch, ctx))


def reason(call) -> str:
    with pytest.raises(TenzroError) as caught:
        call()
    return caught.value.reason


def test_an_honest_batch_is_dismissed_and_a_lie_upheld_by_a_verdict_the_router_can_check(holder_and_verifier):
    handlers, verifier, executor = holder_and_verifier
    method = verify_method(verifier, executor)
    for lie, upheld in ((1.0, False), (1.3, True)):
        wire, carrier, sketch = kept_single(handlers, lie=lie)
        result, row = ask(method, wire, carrier, sketch)
        verdict = verify_verdict(result["verdict"], verifier_id=method.verifier_id, provider_id=wire["provider_id"],
                                 commitment=wire["commitment_hash"], model_id=MODEL, layer=0, expert=0,
                                 blob_uri=URI, worst_row=row)
        assert verdict["upheld"] is upheld, result["detail"]
        assert (verdict["difference_ppm"] > verdict["tolerance_ppm"]) is upheld
        recomputed = verifier.recompute(model_id=MODEL, layer=0, expert=0,
                                        hidden=decode_rows(carrier, "q8_0", tokens=5, d_model=D_MODEL))
        assert row == recomputed[verdict["worst_row"]].astype("<f4").tobytes()
        # the router's checks: another verifier, another batch, a changed field or row are not this verdict
        for changed in ({"verifier_id": "00" * 32}, {"commitment": "11" * 32}, {"worst_row": b"\0" * 4}):
            kwargs = {"verifier_id": method.verifier_id, "provider_id": wire["provider_id"],
                      "commitment": wire["commitment_hash"], "model_id": MODEL, "layer": 0, "expert": 0,
                      "blob_uri": URI, "worst_row": row, **changed}
            with pytest.raises(ReceiptError):
                verify_verdict(result["verdict"], **kwargs)
        flipped = {**result["verdict"], "upheld": not upheld}
        with pytest.raises(ReceiptError, match="not signed"):
            verify_verdict(flipped, verifier_id=method.verifier_id, provider_id=wire["provider_id"],
                           commitment=wire["commitment_hash"], model_id=MODEL, layer=0, expert=0, blob_uri=URI,
                           worst_row=row)


def test_one_batch_of_a_multi_expert_receipt_is_verified_on_its_own(holder_and_verifier):
    handlers, verifier, executor = holder_and_verifier
    rows = np.random.default_rng(3).standard_normal((6, D_MODEL)).astype(np.float32)
    carrier = encode_rows(rows, "f32")
    params = {"model_id": MODEL, "layer": 0, "d_model": D_MODEL, "encoding": "f32",
              "batches": [{"expert": 1, "rows": [0, 2]}, {"expert": 0, "rows": [1, 3, 4, 5]}]}
    result, answer = asyncio.run(handlers.execute(params, carrier, PEER))
    wire = result["receipt"]
    second = np.frombuffer(answer, "<f4").reshape(6, D_MODEL)[2:]
    kept = kept_batch(wire, 1, carrier, sketch_bytes(second, 16))
    assert kept.expert == 0 and kept.hidden.shape == (4, D_MODEL)
    assert kept.commitment == blake3_hex(f"{wire['commitment_hash']}/1".encode())
    method = verify_method(verifier, executor)
    verdict, _ = ask(method, wire, carrier, sketch_bytes(second, 16), batch=1)
    assert verdict["verdict"]["upheld"] is False and verdict["verdict"]["commitment"] == kept.commitment
    # batch 0 is expert 1, which the verifier holds from another blob: not the accused's weights
    first = np.frombuffer(answer, "<f4").reshape(6, D_MODEL)[:2]
    assert reason(lambda: ask(method, wire, carrier, sketch_bytes(first, 16), batch=0)) == "expert_not_held"
    assert reason(lambda: ask(method, wire, carrier, sketch_bytes(second, 16), batch=5)) == "bad_receipt"


def test_evidence_that_does_not_bind_is_refused_before_any_compute(holder_and_verifier):
    handlers, verifier, executor = holder_and_verifier
    method = verify_method(verifier, executor)
    wire, carrier, sketch = kept_single(handlers)
    tampered = bytearray(carrier)
    tampered[40] ^= 1
    forged = {**wire, "signature": HOLDER.sign(b"something else").signature.hex()}
    other_sketch = bytearray(sketch)
    other_sketch[-1] ^= 1
    cases = {
        "a carrier it did not sign": (wire, bytes(tampered), sketch),
        "a sketch it did not commit to": (wire, carrier, bytes(other_sketch)),
        "a forged signature": (forged, carrier, sketch),
        "a field changed after signing": ({**wire, "layer": 1}, carrier, sketch),
        "a batch index on a v1 receipt": None,
        "a truncated body": (wire, carrier[:-3], sketch),
        "not an object": ("receipt", carrier, sketch),
    }
    for what, case in cases.items():
        if case is None:
            assert reason(lambda: ask(method, wire, carrier, sketch, batch=0)) == "bad_receipt", what
            continue
        assert reason(lambda case=case: ask(method, *case)) == "bad_receipt", what
    assert reason(lambda: ask(method, wire, carrier, sketch, uri="tenzro://blob/" + "ef" * 32)) == "expert_not_held"
    assert reason(lambda: ask(method, {**wire, "model_id": "other"}, carrier, sketch)) == "expert_not_held"
    small = verify_method(verifier, executor, max_rows=4)
    assert reason(lambda: ask(small, wire, carrier, sketch)) == "payload_too_large"
    assert ask(method, wire, carrier, sketch)[0]["verdict"]["upheld"] is False  # and it still serves


def test_a_peer_gets_its_rate_and_no_more_while_others_and_the_operator_are_served(holder_and_verifier):
    handlers, verifier, executor = holder_and_verifier
    clock = Clock()
    method = verify_method(verifier, executor, clock=clock, rate=3)
    wire, carrier, sketch = kept_single(handlers)
    for _ in range(3):
        ask(method, wire, carrier, sketch)
    with pytest.raises(TenzroError) as refused:
        ask(method, wire, carrier, sketch)
    assert refused.value.reason == "rate_limited" and "TENZRO_VERIFY_RATE_PER_MIN" in refused.value.message
    other = CallContext(door=Door.PEER, peer=("192.0.2.2", 4433))
    assert ask(method, wire, carrier, sketch, ctx=other)[0]["verdict"]["upheld"] is False
    assert ask(method, wire, carrier, sketch, ctx=CallContext(door=Door.OPERATOR))[0]["verdict"]
    clock.now += 20.0  # a third of a minute: one more
    ask(method, wire, carrier, sketch)
    assert reason(lambda: ask(method, wire, carrier, sketch)) == "rate_limited"


def test_a_verifiers_re_execution_is_not_counted_as_demand(holder_and_verifier):
    _, verifier, _ = holder_and_verifier
    out = verifier.recompute(model_id=MODEL, layer=0, expert=0, hidden=np.ones((3, D_MODEL), np.float32))
    assert out.shape == (3, D_MODEL)
    status = verifier.status()  # every test above had it re-execute; none of it is demand or a rate
    assert status["demand"] == [] and status["committed_tps"] == 0
    with pytest.raises(TenzroError) as missing:
        verifier.recompute(model_id=MODEL, layer=0, expert=9, hidden=np.ones((1, D_MODEL), np.float32))
    assert missing.value.reason == "expert_not_loaded"
