"""The receipt core: sketch, signing, inline verification, keyed sampling, the dispute comparison."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from apps.receipts.commitment import (
    Expected,
    ReceiptError,
    ReceiptSigner,
    answer_sketch,
    blake3_hex,
    canonical_text,
    receipt_body,
    receipt_text,
    sign_receipt,
    sketch_bytes,
    sketch_rows,
    topk_indices,
    topk_reference,
    verify_receipt,
)
from apps.receipts.sampling import keep_receipt, sampling_key
from apps.receipts.verdict import compare_sketch
from core.formats.wire import decode_rows, encode_rows

KEY = SigningKey(bytes(range(32)))
PID = KEY.verify_key.encode().hex()


def test_topk_takes_largest_magnitudes_and_breaks_ties_to_the_lower_index() -> None:
    rows = np.array([[0.5, -3.0, 2.0, 2.0, -2.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], dtype=np.float32)
    assert topk_indices(rows, 3).tolist() == [[1, 2, 3], [0, 1, 2]]
    assert topk_indices(rows, 10).tolist() == [list(range(6))] * 2  # k is capped at d


def test_topk_agrees_with_a_stable_sort_on_random_rows() -> None:
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((50, 300)).astype(np.float32)
    rows[:, 7] = rows[:, 9]  # exact ties too
    want = np.sort(np.argsort(-np.abs(rows), axis=1, kind="stable")[:, :16], axis=1)
    assert (topk_indices(rows, 16) == want).all()


@pytest.mark.parametrize("d, k", [(64, 16), (50, 16), (2048, 16), (7, 7), (33, 1), (100, 40)])
def test_the_compiled_and_block_sketches_equal_the_reference(d: int, k: int) -> None:
    rng = np.random.default_rng(d * 100 + k)
    rows = rng.standard_normal((9, d)).astype(np.float32)
    rows[0] = 1.0  # every feature tied
    rows[1, : d // 2] = 0.0
    rows[2] *= 1e-30  # tiny scales: f16 subnormals on the wire
    rows[3, 1::2] = -rows[3, : d // 2]  # equal magnitudes of opposite signs
    k = min(k, d)
    assert (topk_indices(rows, k) == topk_reference(rows, k)).all()
    answer = encode_rows(rows, "q8_0")
    seen = decode_rows(answer, "q8_0", tokens=9, d_model=d)
    assert answer_sketch(answer, "q8_0", tokens=9, d_model=d, k=k) == sketch_bytes(seen, k)
    assert answer_sketch(encode_rows(rows, "f32"), "f32", tokens=9, d_model=d, k=k) == sketch_bytes(rows, k)


def test_sketch_round_trips_exact_bits() -> None:
    rows = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    idx, values = sketch_rows(sketch_bytes(rows, 8), tokens=4, k=8)
    assert (values.view("<u4") == np.take_along_axis(rows, idx, axis=1).view("<u4")).all()


def _batch(rows: np.ndarray, tokens: list[int], encoding: str = "q8_0", k: int = 16):
    carrier = encode_rows(rows, encoding)
    out = np.tanh(rows) * 3.0  # stands in for the expert
    answer = encode_rows(out, encoding)
    seen = decode_rows(answer, encoding, tokens=len(rows), d_model=rows.shape[1])
    wire = ReceiptSigner(KEY)(model_id="m/é", layer=3, expert=5, token_indices=tokens, d_model=rows.shape[1],
                              input_encoding=encoding, input_carrier=carrier, output_encoding=encoding,
                              answer=answer, k=k)
    body = {name: wire[name] for name in wire if name not in ("commitment_hash", "signature")}
    assert body == receipt_body(provider_id=PID, model_id="m/é", layer=3, expert=5, token_indices=tokens,
                                d_model=rows.shape[1], input_encoding=encoding, input_carrier=carrier,
                                output_encoding=encoding, k=k, sketch=sketch_bytes(seen, k))
    expect = Expected(PID, "m/é", 3, 5, tokens, rows.shape[1], encoding, blake3_hex(carrier), encoding, k)
    return sign_receipt(body, KEY), expect, seen


def test_an_honest_receipt_verifies() -> None:
    rows = np.random.default_rng(3).standard_normal((5, 96)).astype(np.float32)
    receipt, expect, seen = _batch(rows, [0, 2, 4, 6, 8])
    verified, sketch = verify_receipt(receipt.to_wire(), expect, seen)
    assert verified.commitment_hash == receipt.commitment_hash
    assert verify_receipt(receipt.to_wire(), expect, seen, encode_rows(seen, "q8_0"))[1] == sketch
    assert blake3_hex(sketch) == receipt.body["sketch_hash"]


@pytest.mark.parametrize("tamper, why", [
    ("rows", "does not match the returned rows"),
    ("tokens", "token set"),
    ("other_key", "not signed by holder"),
    ("other_input", "different input"),
    ("provider", "not bound to the holder"),
    ("missing", "without a receipt"),
    ("hash", "commitment hash"),
    ("nan", "not all finite"),
    ("version_true", "receipt version"),
    ("version_float", "receipt version"),
])
def test_a_tampered_receipt_is_refused_naming_the_check(tamper: str, why: str) -> None:
    rows = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    receipt, expect, seen = _batch(rows, [1, 2, 3])
    wire = receipt.to_wire()
    if tamper == "rows":
        seen = seen.copy()
        seen[1, int(np.argmax(np.abs(seen[1])))] *= 1.5
    elif tamper == "tokens":
        expect = dataclasses.replace(expect, token_indices=[1, 2, 4])
    elif tamper == "other_key":  # another provider signed the same body
        wire["signature"] = SigningKey.generate().sign(b"x" + canonical(wire)).signature.hex()
    elif tamper == "other_input":
        expect = dataclasses.replace(expect, input_hash=blake3_hex(b"another carrier"))
    elif tamper == "provider":
        expect = dataclasses.replace(expect, provider_id=SigningKey.generate().verify_key.encode().hex())
    elif tamper == "missing":
        wire = None
    elif tamper == "hash":
        wire["commitment_hash"] = "0" * 64
    elif tamper == "nan":
        seen = seen.copy()
        seen[0, 0] = np.nan
    elif tamper in ("version_true", "version_float"):  # equal to 1 in Python, but not the integer 1
        wire["v"] = True if tamper == "version_true" else 1.0
    with pytest.raises(ReceiptError, match=why) as caught:
        verify_receipt(wire, expect, seen)
    assert caught.value.reason == ("receipt_missing" if tamper == "missing" else "bad_receipt")


def canonical(wire: dict) -> bytes:
    return repr(sorted(wire.items())).encode()


# JSON without floats, every character of text included (controls, DEL, non-ASCII, astral), integers
# past 64 bits, keys that are not strings: what canonical_text writes, receipt_text must write too.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.text(st.characters(codec="utf-8"), max_size=12),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4) | st.integers(-3, 3), inner, max_size=4), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(body=st.dictionaries(st.text(max_size=6), _JSON, max_size=6))
def test_the_fast_receipt_text_is_the_canonical_text(body: dict) -> None:
    try:
        want = canonical_text(body).encode("ascii")
    except TypeError:  # keys of both kinds in one object: json cannot sort them, nor can the fast path
        with pytest.raises(TypeError):
            receipt_text(body)
    else:
        assert receipt_text(body) == want


@pytest.mark.parametrize("body", [
    {"model_id": "a\x7fb"},  # ASCII that json escapes and orjson does not
    {"model_id": "Qwen/Qwen3-30B-A3B\u00e9"},
    {"token_indices": [2**64]},
    {"batches": [{"expert": 1, "rows": [0, 1], "sketch_hash": "ab" * 32}], "v": 2},
    {1: "an integer key"},
])
def test_the_fast_receipt_text_falls_back_where_orjson_writes_otherwise(body: dict) -> None:
    assert receipt_text(body) == canonical_text(body).encode("ascii")


def test_sampling_keeps_one_in_n_within_its_statistical_bound_and_is_keyed() -> None:
    """6,400 commitments: Binomial(6400, 1/64) has mean 100 and sd 9.9; 4.5 sd either side."""
    hashes = [blake3_hex(i.to_bytes(4, "little")) for i in range(6400)]
    key = sampling_key(bytes(32))
    kept = {h for h in hashes if keep_receipt(key, h, 64)}
    assert 55 <= len(kept) <= 145
    other = {h for h in hashes if keep_receipt(sampling_key(bytes([1]) * 32), h, 64)}
    public = {h for h in hashes if int(h, 16) % 64 == 0}
    # Another key, or the public rule a holder could compute, picks a near-disjoint set: knowing
    # either tells a holder nothing about this router's (expected overlap 6400/64/64 ~ 1.6).
    assert len(kept & other) <= 8 and len(kept & public) <= 8
    assert all(keep_receipt(key, h, 1) for h in hashes[:10])


def test_a_liar_that_dodges_the_public_rule_is_kept_about_once_in_64_lies_and_upheld() -> None:
    """The planted holder lies exactly on the batches a public rule (hash mod 64) would not keep;
    its receipts are consistent with its lies, so inline verification passes; the router's keyed
    sampling still keeps ~1/64 of the lies, and each kept one is upheld on dispute."""
    rng = np.random.default_rng(5)
    key = sampling_key(rng.bytes(32))
    weight = rng.standard_normal((32, 32)).astype(np.float32) / 6

    def expert(x: np.ndarray) -> np.ndarray:
        return decode_rows(encode_rows(x @ weight.T, "q8_0"), "q8_0", tokens=len(x), d_model=32)

    lies = kept_lies = upheld = 0
    for i in range(6400):
        rows = rng.standard_normal((2, 32)).astype(np.float32)
        receipt, expect, _ = _batch_of(rows, [i, i + 1], expert(decode_rows(encode_rows(rows, "q8_0"), "q8_0",
                                                                          tokens=2, d_model=32)))
        if int(receipt.commitment_hash, 16) % 64 == 0:
            continue  # a public rule would keep this one: stay honest
        lied = expert(rows) * 1.3
        receipt, expect, seen = _batch_of(rows, [i, i + 1], lied)
        verify_receipt(receipt.to_wire(), expect, seen)  # consistent with its lie: passes inline
        lies += 1
        if keep_receipt(key, receipt.commitment_hash, 64):
            kept_lies += 1
            honest = expert(decode_rows(encode_rows(rows, "q8_0"), "q8_0", tokens=2, d_model=32))
            idx, values = sketch_rows(sketch_bytes(seen, 16), tokens=2, k=16)
            upheld += compare_sketch(idx, values, honest, output_encoding="q8_0", compute_tolerance=0.05).upheld
    share = kept_lies / lies
    assert abs(share - 1 / 64) < 4.5 * np.sqrt((1 / 64) * (63 / 64) / lies), (kept_lies, lies)
    assert upheld == kept_lies > 0


def _batch_of(rows: np.ndarray, tokens: list[int], out: np.ndarray, k: int = 16):
    carrier = encode_rows(rows, "q8_0")
    seen = decode_rows(encode_rows(out, "q8_0"), "q8_0", tokens=len(out), d_model=out.shape[1])
    body = receipt_body(provider_id=PID, model_id="m", layer=0, expert=1, token_indices=tokens,
                        d_model=rows.shape[1], input_encoding="q8_0", input_carrier=carrier,
                        output_encoding="q8_0", k=k, sketch=sketch_bytes(seen, k))
    expect = Expected(PID, "m", 0, 1, tokens, rows.shape[1], "q8_0", blake3_hex(carrier), "q8_0", k)
    return sign_receipt(body, KEY), expect, seen


def test_an_honest_recomputation_within_the_compute_paths_error_is_dismissed() -> None:
    rng = np.random.default_rng(6)
    out = rng.standard_normal((8, 128)).astype(np.float32)
    seen = decode_rows(encode_rows(out, "q8_0"), "q8_0", tokens=8, d_model=128)
    idx, values = sketch_rows(sketch_bytes(seen, 16), tokens=8, k=16)
    noisy = out * (1 + 0.01 * rng.standard_normal(out.shape)).astype(np.float32)  # another kernel's rounding
    verdict = compare_sketch(idx, values, noisy, output_encoding="q8_0", compute_tolerance=0.05)
    assert not verdict.upheld and 0 < verdict.difference < verdict.tolerance
    hidden = out.copy()
    hidden[0, idx[0, 0]] = 0.0  # a shrunk feature
    hidden_seen = sketch_rows(sketch_bytes(hidden, 16), tokens=8, k=16)
    assert compare_sketch(*hidden_seen, out, output_encoding="f32", compute_tolerance=0.05).upheld
