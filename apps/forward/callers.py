"""How the forward reaches a holder: this node's runtime, its QUIC door (pinned), or HTTP.

`HolderCaller` is the engine's BatchExecutor. A holder that is this node runs the batch on
the local runtime (no wire, no codec). A holder with a QUIC endpoint and a certificate pin in
its signed record is called over the shared connection pool; any other over HTTP
(`POST /peer/moe/execute`, the same binary frames as on QUIC). Rows travel in the first
activation codec of this node's preference that the holder's record lists (Q8_0 when both
speak it, else f32); encoding and decoding run off the event loop.

A remote answer is accepted only with a receipt that verifies inline (apps.receipts.commitment:
bound to this holder, this model/layer/expert, the batch's token set and the exact bytes sent,
committing to the rows returned, signed by the holder's key); anything else is a holder
failure (`bad_receipt`, `receipt_missing`) and the forward moves on to a backup. The verified
receipt rides the Answer; the router's keyed sampling decides here whether its batch is kept
in full (then the request carrier is kept with it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from apps.forward.engine import Answer
from apps.receipts.commitment import Expected, ReceiptError, SignedReceipt, blake3_hex, verify_receipt
from core.errors import TenzroError, Unavailable, error_for_reason
from core.formats.wire import decode_rows, encode_rows
from core.shardmap.gossip_view import ProviderView
from core.transport.framing import FRAME_CONTENT_TYPE, KIND_RESPONSE, FramingError, decode_frame, request_frame
from core.transport.pool import QuicPool
from core.transport.quic import TransportError

RunLocal = Callable[[int, int, np.ndarray], Awaitable[np.ndarray]]


@dataclass(frozen=True)
class VerifiedBatch:
    """A remote batch's verified receipt; `sketch` and `carrier` (the exact request body) are kept
    only when the router's sampling chose it (`kept`), to be persisted in full."""

    receipt: SignedReceipt
    kept: bool
    sketch: bytes | None = None
    carrier: bytes | None = None


def codec_for(holder: ProviderView, preferred: tuple[str, ...]) -> str:
    """The first of our codecs (preferred first) that the holder's record lists; f32 at worst."""
    return next((c for c in preferred if c in holder.activation_codecs), "f32")


class HolderCaller:
    def __init__(self, *, self_id: str, model_id: str, d_model: int, run_local: RunLocal, pool: QuicPool,
                 http: httpx.AsyncClient, codecs: tuple[str, ...], codec_executor: Executor,
                 max_body: int, timeout_s: float, receipt_topk: int, keep_receipt: Callable[[str], bool]) -> None:
        self.self_id = self_id
        self.model_id = model_id
        self.d_model = d_model
        self._run_local = run_local
        self._pool = pool
        self._http = http
        self._codecs = codecs
        self._codec_executor = codec_executor
        self._max_body = max_body
        self._timeout_s = timeout_s  # the engine's own per-attempt limit cancels sooner; this is a backstop
        self._topk = receipt_topk
        self._keep = keep_receipt

    async def __call__(self, holder: ProviderView, layer: int, expert: int, rows: np.ndarray,
                       tokens: np.ndarray) -> Answer:
        if holder.provider_id == self.self_id:
            return Answer(await self._run_local(layer, expert, rows))
        codec = codec_for(holder, self._codecs)
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(self._codec_executor, encode_rows, rows, codec)
        token_indices = [int(t) for t in tokens]
        params = {"model_id": self.model_id, "layer": layer, "expert": expert, "d_model": self.d_model,
                  "tokens": len(rows), "encoding": codec, "token_indices": token_indices, "receipt_topk": self._topk}
        if holder.quic_endpoint and holder.quic_cert_sha256:
            host, _, port = holder.quic_endpoint.rpartition(":")
            try:
                result, answer = await self._pool.call(host=host.strip("[]"), port=int(port),
                                                       pin_sha256=holder.quic_cert_sha256, method="moe/execute",
                                                       params=params, body=body, timeout_s=self._timeout_s)
            except TransportError as exc:
                raise error_for_reason(exc.reason, f"{holder.provider_id[:16]}… over QUIC: {exc}") from exc
            except (ValueError, RuntimeError, AssertionError) as exc:  # the QUIC library's own refusals
                raise Unavailable(f"{holder.provider_id[:16]}… over QUIC: {type(exc).__name__}: {exc}",
                                  reason="transport_error") from exc
            transport = "quic"
        elif holder.http_endpoint:
            result, answer = await self._http_call(holder.http_endpoint, params, body)
            transport = "http"
        else:
            raise Unavailable(f"provider {holder.provider_id[:16]}… advertises no endpoint", reason="unreachable")
        expect = Expected(holder.provider_id, self.model_id, layer, expert, token_indices, self.d_model, codec,
                          "", codec, self._topk)
        out, verified = await loop.run_in_executor(self._codec_executor, self._accept, result, answer, body, expect)
        compute_ms = result.get("compute_ms")
        compute_s = compute_ms / 1000.0 if isinstance(compute_ms, int | float) and compute_ms >= 0 else None
        return Answer(out, bytes_sent=len(body), bytes_received=len(answer), transport=transport,
                      compute_s=compute_s, receipt=verified)

    def _accept(self, result: dict[str, Any], answer: bytes | bytearray, body: bytes,
                expect: Expected) -> tuple[np.ndarray, VerifiedBatch]:
        """Decode the answer's rows and verify its receipt against them (on the codec executor)."""
        out = self._decode(result, answer, expect.input_encoding, len(expect.token_indices))
        expect = dataclasses.replace(expect, input_hash=blake3_hex(body))
        try:
            receipt, sketch = verify_receipt(result.get("receipt"), expect, out, answer)
        except ReceiptError as exc:
            raise error_for_reason(exc.reason, f"{expect.provider_id[:16]}…: {exc}") from exc
        if self._keep(receipt.commitment_hash):
            return out, VerifiedBatch(receipt, True, sketch, body)
        return out, VerifiedBatch(receipt, False)

    def _decode(self, result: dict[str, Any], answer: bytes | bytearray, codec: str, tokens: int) -> np.ndarray:
        if result.get("encoding", "f32") != codec or result.get("tokens") != tokens:
            raise TenzroError(f"holder answered {result.get('tokens')} rows in {result.get('encoding')!r}, "
                              f"asked {tokens} in {codec!r}", reason="bad_answer")
        try:
            return decode_rows(answer, codec, tokens=tokens, d_model=self.d_model)
        except ValueError as exc:
            raise TenzroError(f"holder's answer does not decode: {exc}", reason="bad_answer") from exc

    async def _http_call(self, base: str, params: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        url = base.rstrip("/") + "/peer/moe/execute"
        try:
            response = await self._http.post(url, content=request_frame("moe/execute", params, body),
                                             headers={"content-type": FRAME_CONTENT_TYPE})
        except httpx.HTTPError as exc:
            raise Unavailable(f"{url}: {type(exc).__name__}: {exc}", reason="connection_failed") from exc
        if response.headers.get("content-type", "").split(";")[0] != FRAME_CONTENT_TYPE:
            raise Unavailable(f"{url} answered HTTP {response.status_code} without a frame", reason="bad_answer")
        try:
            frame = decode_frame(response.content, kind=KIND_RESPONSE, max_body=self._max_body)
        except FramingError as exc:
            raise Unavailable(f"{url}: {exc}", reason="bad_answer") from exc
        header = frame.header
        if not header.get("ok"):
            error = header.get("error") or {}
            raise error_for_reason(error.get("reason", "remote_error"), f"{url}: {error.get('message', '')}")
        return header.get("result", {}), bytes(frame.body)
