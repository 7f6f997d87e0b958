"""`receipt/verify`: another holder's kept batch re-executed with this node's own copy of the expert,
answered with a signed verdict (docs/protocol.md, "Disputes by another holder").

Pure module (no Django, no transport): the expert worker builds it with its runtime, its compute
executor and the node key, and serves it at both doors (apps/worker/doors.py). What it costs a
verifier is bounded: the peer door's body limit bounds the bytes, TENZRO_VERIFY_MAX_ROWS the rows,
a token bucket per peer (TENZRO_VERIFY_RATE_PER_MIN) how often, and one re-execution runs at a time.
It refuses, before any compute, evidence that does not bind (apps/receipts/evidence.kept_batch) and
an expert it does not hold from exactly the blob the accused holder announced: another
quantization of the same expert would differ by more than the tolerance and prove nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np
from nacl.signing import SigningKey

from apps.receipts.commitment import ReceiptError
from apps.receipts.evidence import carrier_bytes, kept_batch, sign_verdict, verdict_body
from apps.receipts.verdict import compare_sketch
from core.errors import InvalidInput, NotFound, PayloadTooLarge, RateLimited

Result = tuple[dict[str, Any], bytes]
MAX_TRACKED_PEERS = 4096


class VerifyMethod:
    def __init__(self, *, runtime: Any, executor: Executor, signing_key: SigningKey, compute_tolerance: float,
                 max_rows: int, rate_per_min: int, clock: Callable[[], float] = time.monotonic) -> None:
        """`runtime`: core.experts.runtime.ExpertRuntime (its `held` and `recompute`)."""
        self._runtime, self._executor, self._key = runtime, executor, signing_key
        self.verifier_id = signing_key.verify_key.encode().hex()
        self._tolerance, self._max_rows = compute_tolerance, max_rows
        self._rate, self._clock = max(rate_per_min, 0), clock
        self._buckets: dict[str, tuple[float, float]] = {}  # peer host -> (tokens, when)
        self._one_at_a_time = asyncio.Lock()

    def table(self) -> dict[str, Callable[..., Awaitable[Result]]]:
        return {"receipt/verify": self.verify}

    def _admit(self, ctx: Any) -> None:
        """A token bucket of TENZRO_VERIFY_RATE_PER_MIN per peer host (a peer-door call without an address
        counts as one peer, "unknown"); the operator door is not counted."""
        if getattr(getattr(ctx, "door", None), "value", None) != "peer":
            return
        host = ctx.peer[0] if ctx.peer else "unknown"
        now = self._clock()
        if len(self._buckets) > MAX_TRACKED_PEERS:  # forget the full ones: they would start full anyway
            full_after = 60.0
            self._buckets = {h: b for h, b in self._buckets.items() if now - b[1] < full_after}
        tokens, when = self._buckets.get(host, (float(self._rate), now))
        tokens = min(float(self._rate), tokens + (now - when) * self._rate / 60.0)
        if tokens < 1.0:
            wait = (1.0 - tokens) * 60.0 / self._rate if self._rate else float("inf")
            self._buckets[host] = (tokens, now)
            raise RateLimited(f"this node re-executes at most {self._rate} kept batches a minute for one peer "
                              f"(TENZRO_VERIFY_RATE_PER_MIN); try again in {wait:.1f} s", reason="rate_limited",
                              retry_after_s=round(wait, 1))
        self._buckets[host] = (tokens - 1.0, now)

    def _held_from(self, model_id: Any, blob_uri: str) -> set[tuple[int, int]]:
        """(layer, expert) of what this node holds of `model_id` from exactly `blob_uri`."""
        if not isinstance(model_id, str):
            return set()
        return {(layer, expert) for layer, expert, _, uri in self._runtime.held(model_id) if uri == blob_uri}

    async def verify(self, params: dict[str, Any], body: bytes | bytearray, ctx: Any) -> Result:
        """params {receipt, batch, blob_uri}; body: the carrier, then the batch's sketch. Answers
        {verdict, detail} with the recomputed worst row (f32 little-endian) as the body."""
        self._admit(ctx)
        receipt, batch, blob_uri = params.get("receipt"), params.get("batch"), params.get("blob_uri")
        if not isinstance(blob_uri, str) or not blob_uri:
            raise InvalidInput("param 'blob_uri' must name the blob the accused holder announced for the expert "
                               "(tenzro://blob/<hash>)", param="blob_uri")
        if not isinstance(receipt, dict):
            raise InvalidInput("param 'receipt' must be the kept receipt as it came (its fields, commitment_hash "
                               "and signature)", param="receipt", reason="bad_receipt")
        try:
            split = carrier_bytes(receipt)
        except ReceiptError as exc:
            raise InvalidInput(str(exc), reason="bad_receipt", param="receipt") from exc
        rows = len(receipt["token_indices"])
        if rows > self._max_rows:
            raise PayloadTooLarge(f"the kept batch's carrier has {rows} rows, more than the {self._max_rows} this "
                                  "node re-executes for a peer (TENZRO_VERIFY_MAX_ROWS)", limit_rows=self._max_rows)
        held = self._held_from(receipt.get("model_id"), blob_uri)
        if not held:
            raise NotFound(f"this node holds no expert of {receipt.get('model_id')!r} from {blob_uri}: ask a holder "
                           "of that blob", reason="expert_not_held")
        view = memoryview(body)
        try:
            kept = await ctx.run_blocking(self._executor, kept_batch, receipt, batch, view[:split], view[split:])
        except ReceiptError as exc:
            raise InvalidInput(str(exc), reason="bad_receipt") from exc
        if (kept.body["layer"], kept.expert) not in held:
            raise NotFound(f"{blob_uri} is not layer {kept.body['layer']} expert {kept.expert} of "
                           f"{kept.body['model_id']!r} on this node", reason="expert_not_held")
        async with self._one_at_a_time:
            recomputed = await ctx.run_blocking(self._executor, self._runtime.recompute,
                                                model_id=kept.body["model_id"], layer=kept.body["layer"],
                                                expert=kept.expert, hidden=kept.hidden)
        comparison = compare_sketch(kept.indices, kept.values, recomputed,
                                    output_encoding=kept.body["output_encoding"], compute_tolerance=self._tolerance)
        worst = (np.ascontiguousarray(recomputed[comparison.worst_row], dtype="<f4").tobytes()
                 if comparison.worst_row >= 0 else b"")
        verdict = sign_verdict(verdict_body(verifier_id=self.verifier_id, kept=kept, blob_uri=blob_uri,
                                            comparison=comparison, worst_row=worst), self._key)
        return {"verdict": verdict, "detail": comparison.detail}, worst
