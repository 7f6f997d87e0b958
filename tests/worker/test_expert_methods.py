"""The holder's multi-expert moe/execute (docs/protocol.md, "Multi-expert execute"): the same rows as
the single-expert requests, bit for bit, and a whole-frame refusal for every way a frame can be wrong,
after which the holder serves the next request."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from nacl.signing import SigningKey

from apps.receipts.commitment import ExpectedBatches, ReceiptSigner, blake3_hex, verify_batches_receipt
from apps.worker.doors import CallContext, Door
from apps.worker.expert_methods import ExpertHandlers
from core.errors import TenzroError
from core.experts.runtime import ExpertRuntime
from core.formats.wire import decode_rows, encode_rows
from tests.experts.factories import expert_payload, expert_weights

MODEL, D_MODEL, D_FF = "methods-test", 64, 32
SIGNER = ReceiptSigner(SigningKey(bytes(range(32))))


@pytest.fixture(scope="module")
def handlers(tmp_path_factory):
    runtime = ExpertRuntime(data_dir=tmp_path_factory.mktemp("holder"), memory_budget_bytes=1 << 26)
    rng = np.random.default_rng(21)
    for e, quant in enumerate(["q8_0", "q4_k_m", None, "q8_0"]):
        runtime.expert_load(payload=expert_payload(expert_weights(rng, D_MODEL, D_FF * 8 if quant == "q4_k_m"
                                                                  else D_FF), expert=e, model_id=MODEL,
                                                   quant=quant))
    with ThreadPoolExecutor(2) as executor:
        yield ExpertHandlers(runtime=runtime, executor=executor, max_payload_bytes=1 << 20, sign_receipt=SIGNER,
                             max_answer_bytes=1 << 16)


def _call(handlers: ExpertHandlers, params: dict, body: bytes) -> tuple[dict, bytes]:
    return asyncio.run(handlers.execute(params, body, CallContext(door=Door.PEER)))


def _params(codec: str, n: int, batches: list[dict], **extra) -> dict:
    return {"model_id": MODEL, "layer": 0, "d_model": D_MODEL, "tokens": n, "encoding": codec,
            "token_indices": [10 + 2 * i for i in range(n)], "batches": batches, **extra}


@pytest.mark.parametrize("codec", ["q8_0", "f32"])
def test_a_multi_expert_request_equals_the_single_expert_requests_bit_for_bit(handlers, codec) -> None:
    rows = np.random.default_rng(4).standard_normal((7, D_MODEL)).astype(np.float32)
    body = encode_rows(rows, codec)
    batches = [{"expert": 2, "rows": [0, 3, 6]}, {"expert": 0, "rows": [1, 2, 3, 4]}, {"expert": 1, "rows": [5]},
               {"expert": 3, "rows": list(range(7))}]
    result, answer = _call(handlers, _params(codec, 7, batches), body)
    assert [(b["expert"], b["tokens"]) for b in result["batches"]] == [(b["expert"], len(b["rows"])) for b in batches]
    carrier = decode_rows(body, codec, tokens=7, d_model=D_MODEL)
    offset, parts = 0, []
    for batch in batches:
        sub = carrier[batch["rows"]]
        _, data = _call(handlers, {"model_id": MODEL, "layer": 0, "expert": batch["expert"], "d_model": D_MODEL,
                                        "tokens": len(sub), "encoding": codec}, encode_rows(sub, codec))
        assert answer[offset: offset + len(data)] == data, f"expert {batch['expert']}"  # the same bytes
        parts.append((decode_rows(data, codec, tokens=len(sub), d_model=D_MODEL), data))
        offset += len(data)
    assert offset == len(answer)
    # one v2 receipt over them all, verifying against the request as the router would check it
    expect = ExpectedBatches(SIGNER.provider_id, MODEL, 0, [10 + 2 * i for i in range(7)], D_MODEL, codec,
                             blake3_hex(body), codec, 16, [(b["expert"], b["rows"]) for b in batches])
    receipt, _ = verify_batches_receipt(result["receipt"], expect, parts)
    assert len(receipt.body["batches"]) == 4


ROWS = encode_rows(np.ones((3, D_MODEL), np.float32), "f32")
BAD = {
    "batches not a list": ({"batches": {"expert": 0}}, ROWS, "invalid_input", "param 'batches'"),
    "no batches": ({"batches": []}, ROWS, "invalid_input", "param 'batches'"),
    "an entry with another key": ({"batches": [{"expert": 0, "rows": [0], "x": 1}]}, ROWS, "invalid_input",
                                  "batches[0]"),
    "a negative expert": ({"batches": [{"expert": -1, "rows": [0]}]}, ROWS, "invalid_input", "batches[0].expert"),
    "an expert twice": ({"batches": [{"expert": 0, "rows": [0]}, {"expert": 0, "rows": [1]}]}, ROWS,
                        "duplicate_expert", "expert 0 is listed twice"),
    "a row out of range": ({"batches": [{"expert": 0, "rows": [0, 3]}]}, ROWS, "invalid_input", "[0, 3)"),
    "rows not ascending": ({"batches": [{"expert": 0, "rows": [1, 0]}]}, ROWS, "invalid_input", "ascending"),
    "a row twice": ({"batches": [{"expert": 0, "rows": [1, 1]}]}, ROWS, "invalid_input", "ascending"),
    "no rows": ({"batches": [{"expert": 0, "rows": []}]}, ROWS, "invalid_input", "non-empty"),
    "experts not held": ({"batches": [{"expert": 0, "rows": [0]}, {"expert": 7, "rows": [1]},
                                      {"expert": 9, "rows": [2]}]}, ROWS, "expert_not_loaded", "experts [7, 9]"),
    "rows that are not whole": ({"batches": [{"expert": 0, "rows": [0]}]}, ROWS[:-4], "shape_mismatch", ""),
    "both forms": ({"batches": [{"expert": 0, "rows": [0]}], "expert": 0}, ROWS, "invalid_input", "not both"),
    "token_indices of another length": ({"batches": [{"expert": 0, "rows": [0]}], "token_indices": [1]}, ROWS,
                                        "invalid_input", "token_indices"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_wrong_frame_is_refused_whole_naming_what_is_wrong_and_the_holder_serves_on(handlers, case) -> None:
    extra, body, reason, words = BAD[case]
    params = {**_params("f32", 3, []), **extra}
    if "token_indices" not in extra:
        params["token_indices"] = [0, 1, 2]
    with pytest.raises(TenzroError) as info:
        _call(handlers, params, body)
    assert info.value.reason == reason and words in info.value.message, (info.value.reason, info.value.message)
    if case == "experts not held":
        assert info.value.details["experts"] == [7, 9]
    result, _ = _call(handlers, _params("f32", 3, [{"expert": 0, "rows": [0, 1, 2]}]), ROWS)
    assert result["batches"][0]["tokens"] == 3


def test_an_answer_over_the_holders_limit_is_refused_before_computing(handlers) -> None:
    many = encode_rows(np.ones((80, D_MODEL), np.float32), "f32")  # 4 experts x 80 rows x 256 B > 64 KiB
    params = _params("f32", 80, [{"expert": e, "rows": list(range(80))} for e in range(4)])
    with pytest.raises(TenzroError) as info:
        _call(handlers, params, many)
    assert info.value.reason == "payload_too_large" and info.value.details["limit_bytes"] == 1 << 16


def test_a_decode_sized_frame_computes_on_the_loop_unless_another_frame_is_computing(handlers) -> None:
    """inline_rows: a frame of at most that many rows runs on the event loop (run_inline, counted
    computed_inline), with the same answer as on a thread; a larger one, or one arriving while
    another frame is on the threads, goes to the threads; a passed deadline still drops it."""
    rows = np.random.default_rng(8).standard_normal((6, D_MODEL)).astype(np.float32)
    body = encode_rows(rows, "q8_0")
    small = _params("q8_0", 6, [{"expert": 0, "rows": [0, 1]}, {"expert": 2, "rows": [3, 4, 5]}])
    large = _params("q8_0", 6, [{"expert": 1, "rows": list(range(6))}, {"expert": 3, "rows": list(range(6))}])
    with ThreadPoolExecutor(2) as executor:
        inline = ExpertHandlers(runtime=handlers.runtime, executor=executor, max_payload_bytes=1 << 20,
                                sign_receipt=SIGNER, max_answer_bytes=1 << 16, inline_rows=8)
        counts: Counter[str] = Counter()

        def context(**kwargs) -> CallContext:
            return CallContext(door=Door.PEER, counts=counts, **kwargs)

        result, answer = asyncio.run(inline.execute(small, body, context()))
        assert counts["peer.computed_inline"] == 1
        assert answer == _call(handlers, small, body)[1]  # the threads' answer, bit for bit
        assert [b["tokens"] for b in result["batches"]] == [2, 3]
        asyncio.run(inline.execute(large, body, context()))  # 12 rows: over the limit
        assert counts["peer.computed_inline"] == 1

        async def together():  # the large frame is on the threads when the small one arrives
            return await asyncio.gather(inline.execute(large, body, context()), inline.execute(small, body, context()))

        _, (_, answer_small) = asyncio.run(together())
        assert counts["peer.computed_inline"] == 1 and answer_small == answer
        with pytest.raises(TenzroError) as info:
            asyncio.run(inline.execute(small, body, context(deadline=time.time() - 1)))
        assert info.value.reason == "deadline_exceeded" and counts["peer.dropped_past_deadline"] == 1
        assert counts["peer.computed_inline"] == 1
