"""How the forward reaches a holder: this node's runtime, its QUIC door (pinned), or HTTP.

`HolderCaller` is the engine's BatchExecutor. A holder that is this node runs the batch on
the local runtime (no wire, no codec). A holder with a QUIC endpoint and a certificate pin in
its signed record is called over the shared connection pool; any other over HTTP
(`POST /peer/moe/execute`, the same binary frames as on QUIC). Rows travel in the first
activation codec of this node's preference that the holder's record lists (Q8_0 when both
speak it, else f32); encoding and decoding run off the event loop, but for a few rows (INLINE_ROWS),
which cost less than the thread hops.

A holder whose record advertises `execute_batches` gets one request per layer step: the batches
the engine hands this caller for it in one turn of the event loop (every batch of a wave starts
in the same turn) are gathered and sent as one multi-expert `moe/execute` (docs/protocol.md,
"Multi-expert execute"): the union of their rows once, each expert's rows named by position,
one v2 receipt over all of them, verified with one signature check. Each batch still gets its
own Answer (and verified batch commitment), so the engine's failover, hedging and replanning
stay per batch: when the shared request fails, every batch in it fails over on its own, and
when every batch waiting on it was raced out or timed out, it is cancelled.

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
import itertools
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from apps.forward.report import Answer
from apps.receipts.commitment import (
    Expected,
    ExpectedBatches,
    ReceiptError,
    SignedReceipt,
    batch_commitment,
    blake3_hex,
    verify_batches_receipt,
    verify_receipt,
)
from core.errors import TenzroError, Unavailable, error_for_reason
from core.formats.wire import decode_rows, encode_rows, encoded_row_bytes
from core.shardmap.gossip_view import ProviderView
from core.transport.framing import FRAME_CONTENT_TYPE, KIND_RESPONSE, FramingError, decode_frame, request_frame
from core.transport.pool import QuicPool
from core.transport.quic import TransportError

RunLocal = Callable[[int, int, np.ndarray], Awaitable[np.ndarray]]
# Encoding and verifying this many rows takes tens of microseconds: less than the two thread hops
# that running it on the codec executor costs (a decode step's batches are a row or a few).
INLINE_ROWS = 16


@dataclass(frozen=True)
class VerifiedBatch:
    """A remote batch's verified receipt; `sketch` and `carrier` (the exact request body) are kept
    only when the router's sampling chose it (`kept`), to be persisted in full. `commitment` is the
    batch's own: the receipt's commitment hash for a single-expert receipt, `batch_commitment` of
    it and `batch` (the batch's place in the receipt's list) for a multi-expert one."""

    receipt: SignedReceipt
    kept: bool
    sketch: bytes | None = None
    carrier: bytes | None = None
    commitment: str = ""
    layer: int = 0
    expert: int = 0
    batch: int | None = None


@dataclass
class _Gathered:
    """Batches for one holder and layer asked for in one turn of the event loop: one request."""

    holder: ProviderView
    layer: int
    calls: list[tuple[int, np.ndarray, np.ndarray, asyncio.Future[Answer]]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def experts(self) -> set[int]:
        return {expert for expert, *_ in self.calls}

    def abandoned(self) -> bool:
        return all(future.done() for *_, future in self.calls)


def codec_for(holder: ProviderView, preferred: tuple[str, ...]) -> str:
    """The first of our codecs (preferred first) that the holder's record lists; f32 at worst."""
    return next((c for c in preferred if c in holder.activation_codecs), "f32")


def _quic_address(holder: ProviderView) -> tuple[str, int] | None:
    """(host, port) of the holder's QUIC door, when its record pins a certificate for it."""
    if not (holder.quic_endpoint and holder.quic_cert_sha256):
        return None
    host, _, port = holder.quic_endpoint.rpartition(":")
    return host.strip("[]"), int(port)


class HolderCaller:
    def __init__(self, *, self_id: str, model_id: str, d_model: int, run_local: RunLocal, pool: QuicPool,
                 http: Callable[[], httpx.AsyncClient], codecs: tuple[str, ...], codec_executor: Executor,
                 max_body: int, timeout_s: float, receipt_topk: int, keep_receipt: Callable[[str], bool],
                 gather_batches: bool = True) -> None:
        self.self_id = self_id
        self.model_id = model_id
        self.d_model = d_model
        self._run_local = run_local
        self._pool = pool
        self._http = http  # the HTTP client, asked for at the first holder called over HTTP
        self._codecs = codecs
        self._codec_executor = codec_executor
        self._max_body = max_body
        self._timeout_s = timeout_s  # the engine's own per-attempt limit cancels sooner; this is a backstop
        self._topk = receipt_topk
        self._keep = keep_receipt
        self._gather_batches = gather_batches
        self._open: dict[tuple[str, int], _Gathered] = {}  # requests still gathering batches this turn
        self._requests = itertools.count()  # ids of the multi-expert requests sent (Answer.request)

    def gathers(self, holder: ProviderView) -> bool:
        """Batches for `holder` started in one turn travel as one multi-expert request."""
        return self._gather_batches and holder.execute_batches and holder.provider_id != self.self_id

    def heard_since(self, holder: ProviderView, since: float) -> bool | None:
        """Whether the holder's QUIC connections received anything at or after `since` (time.monotonic());
        None where it is not reached over QUIC (this node, HTTP)."""
        address = _quic_address(holder)
        if address is None or holder.provider_id == self.self_id:  # _quic_address: a pinned QUIC door
            return None
        return self._pool.heard_since(host=address[0], port=address[1], pin_sha256=holder.quic_cert_sha256,
                                      since=since)

    def lanes(self, holder: ProviderView, rows: int) -> list[tuple[int, int]]:
        """The QUIC connection lanes a request of `rows` rows each way to `holder` may be split over now,
        each with its window (QuicPool.lanes_for); [(0, 0)] over HTTP."""
        address = _quic_address(holder)
        if address is None:
            return [(0, 0)]
        nbytes = rows * encoded_row_bytes(codec_for(holder, self._codecs), self.d_model)
        return self._pool.lanes_for(host=address[0], port=address[1], pin_sha256=holder.quic_cert_sha256,
                                    nbytes=nbytes)

    async def __call__(self, holder: ProviderView, layer: int, expert: int, rows: np.ndarray,
                       tokens: np.ndarray) -> Answer:
        if holder.provider_id == self.self_id:
            return Answer(await self._run_local(layer, expert, rows))
        if self.gathers(holder):
            return await self._gathered(holder, layer, expert, rows, tokens)
        codec = codec_for(holder, self._codecs)
        body = await self._codec(len(rows), encode_rows, rows, codec)
        token_indices = [int(t) for t in tokens]
        params = {"model_id": self.model_id, "layer": layer, "expert": expert, "d_model": self.d_model,
                  "tokens": len(rows), "encoding": codec, "token_indices": token_indices, "receipt_topk": self._topk}
        result, answer, transport, rtt_s = await self._request(holder, params, body)
        expect = Expected(holder.provider_id, self.model_id, layer, expert, token_indices, self.d_model, codec,
                          "", codec, self._topk)
        out, verified = await self._codec(len(rows), self._accept, result, answer, body, expect)
        return Answer(out, bytes_sent=len(body), bytes_received=len(answer), transport=transport,
                      compute_s=_seconds(result.get("compute_ms")), receipt=verified, rtt_s=rtt_s)

    async def _codec(self, rows: int, func: Callable[..., Any], /, *args: Any) -> Any:
        """`func(*args)`: inline for a few rows, else on the codec executor (off the event loop)."""
        if rows <= INLINE_ROWS:
            return func(*args)
        return await asyncio.get_running_loop().run_in_executor(self._codec_executor, func, *args)

    async def _request(self, holder: ProviderView, params: dict[str, Any], body: bytes, lane: int = 0
                       ) -> tuple[dict[str, Any], bytes | bytearray, str, float | None]:
        """One moe/execute to `holder`: over QUIC (its `lane`th connection) when its record pins a
        certificate, else HTTP. (result, answer body, transport, the path's smoothed RTT or None)."""
        if (address := _quic_address(holder)) is not None:
            try:
                result, answer = await self._pool.call(host=address[0], port=address[1],
                                                       pin_sha256=holder.quic_cert_sha256, method="moe/execute",
                                                       params=params, body=body, timeout_s=self._timeout_s, lane=lane)
            except TransportError as exc:
                raise error_for_reason(exc.reason, f"{holder.provider_id[:16]}… over QUIC: {exc}") from exc
            except (ValueError, RuntimeError, AssertionError) as exc:  # the QUIC library's own refusals
                raise Unavailable(f"{holder.provider_id[:16]}… over QUIC: {type(exc).__name__}: {exc}",
                                  reason="transport_error") from exc
            rtt_s = self._pool.smoothed_rtt_s(host=address[0], port=address[1], pin_sha256=holder.quic_cert_sha256)
            return result, answer, "quic", rtt_s
        if holder.http_endpoint:
            result, answer = await self._http_call(holder.http_endpoint, params, body)
            return result, answer, "http", None
        raise Unavailable(f"provider {holder.provider_id[:16]}… advertises no endpoint", reason="unreachable")

    # -- one request per holder and layer step ------------------------------------------------

    async def _gathered(self, holder: ProviderView, layer: int, expert: int, rows: np.ndarray,
                        tokens: np.ndarray) -> Answer:
        """This batch's answer from the request gathering every batch asked of `holder` this turn."""
        loop = asyncio.get_running_loop()
        key = (holder.provider_id, layer)
        group = self._open.get(key)
        if group is None or expert in group.experts():  # an expert twice (two forwards' waves): a request of its own
            group = self._open[key] = _Gathered(holder, layer)
            loop.call_soon(self._send_gathered, key, group)  # after every batch started this turn has joined
        future: asyncio.Future[Answer] = loop.create_future()
        group.calls.append((expert, rows, tokens, future))

        def left(_: asyncio.Future[Answer]) -> None:  # answered, failed, raced out or timed out
            if group.task is not None and not group.task.done() and group.abandoned():
                group.task.cancel()  # nobody waits for it any more: the stream is reset, the holder stops

        future.add_done_callback(left)
        return await future

    def _send_gathered(self, key: tuple[str, int], group: _Gathered) -> None:
        if self._open.get(key) is group:
            del self._open[key]
        if not group.abandoned():
            group.task = asyncio.ensure_future(self._serve_gathered(group))

    async def many(self, holder: ProviderView, layer: int, calls: list[tuple[int, np.ndarray, np.ndarray]],
                   lane: int = 0) -> list[Answer]:
        """The engine's own gathering: every (expert, rows, tokens) of a wave's batches for `holder` (one
        that `gathers`) in one multi-expert request on connection lane `lane`, answered in order."""
        return await self._call_batches(holder, layer, calls, lane)

    async def _serve_gathered(self, group: _Gathered) -> None:
        calls = [c for c in group.calls if not c[3].done()]
        try:
            answers = await self._call_batches(group.holder, group.layer, [c[:3] for c in calls])
        except asyncio.CancelledError:
            for *_, future in calls:
                future.cancel()
            raise
        except Exception as exc:  # every batch of the request failed with it, each fails over on its own
            for *_, future in calls:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_, future), answer in zip(calls, answers, strict=True):
            if not future.done():
                future.set_result(answer)

    async def _call_batches(self, holder: ProviderView, layer: int,
                            calls: list[tuple[int, np.ndarray, np.ndarray]], lane: int = 0) -> list[Answer]:
        """One multi-expert moe/execute for `calls` [(expert, rows f32 [n_i, d], tokens int64 [n_i])]:
        each token's row once in the carrier, each batch's rows named by position."""
        codec = codec_for(holder, self._codecs)
        carrier, token_indices, positions = _carrier(calls)
        body = await self._codec(len(carrier), encode_rows, carrier, codec)
        batches = [(expert, rows) for (expert, *_), rows in zip(calls, positions, strict=True)]
        params = {"model_id": self.model_id, "layer": layer, "d_model": self.d_model, "tokens": len(carrier),
                  "encoding": codec, "token_indices": token_indices, "receipt_topk": self._topk,
                  "batches": [{"expert": e, "rows": rows} for e, rows in batches]}
        result, answer, transport, rtt_s = await self._request(holder, params, body, lane)
        expect = ExpectedBatches(holder.provider_id, self.model_id, layer, token_indices, self.d_model, codec,
                                 blake3_hex(body), codec, self._topk, batches)
        n_rows = sum(len(rows) for _, rows in batches)
        outs, sizes, verified = await self._codec(n_rows, self._accept_batches, result, answer, body, expect)
        reported = result.get("batches")
        sent = [len(body) * len(rows) // n_rows for _, rows in batches]  # the request's bytes, shared by rows
        sent[0] += len(body) - sum(sent)
        request = next(self._requests)
        return [Answer(out, bytes_sent=sent[i], bytes_received=sizes[i], transport=transport,
                       compute_s=_seconds(reported[i].get("compute_ms")), receipt=batch, request=request,
                       rtt_s=rtt_s)
                for i, (out, batch) in enumerate(zip(outs, verified, strict=True))]

    def _accept_batches(self, result: dict[str, Any], answer: bytes | bytearray, body: bytes, expect: ExpectedBatches
                        ) -> tuple[list[np.ndarray], list[int], list[VerifiedBatch]]:
        """Split a multi-expert answer into its batches' rows (f32 [n_i, d_model] each) and their sizes on the
        wire, and verify its one receipt (inline for a few rows, else on the codec executor)."""
        codec, batches = expect.input_encoding, expect.batches
        reported = result.get("batches")
        if result.get("encoding", "f32") != codec or not isinstance(reported, list) or len(reported) != len(batches) \
                or any(not isinstance(r, dict) or r.get("expert") != e or r.get("tokens") != len(rows)
                       for r, (e, rows) in zip(reported, batches, strict=False)):
            raise TenzroError(f"holder answered batches {str(reported)[:200]} in {result.get('encoding')!r}, asked "
                              f"{[(e, len(rows)) for e, rows in batches]} in {codec!r}", reason="bad_answer")
        row_bytes = encoded_row_bytes(codec, self.d_model)
        counts = [len(rows) for _, rows in batches]
        total = sum(counts)
        if total * row_bytes != len(answer):
            raise TenzroError(f"holder's answer has {len(answer)} bytes, its batches need {total * row_bytes}",
                              reason="bad_answer")
        try:  # in one call (the codecs work row by row): a decode step's eight one-row calls cost more
            rows_out = decode_rows(answer, codec, tokens=total, d_model=self.d_model)
        except ValueError as exc:
            raise TenzroError(f"holder's answer does not decode: {exc}", reason="bad_answer") from exc
        view, outs, start = memoryview(answer), [], 0
        for n in counts:  # each batch's rows and its bytes as they came (views: the sketch reads them here)
            outs.append((rows_out[start:start + n], view[start * row_bytes:(start + n) * row_bytes]))
            start += n
        try:
            receipt, sketches = verify_batches_receipt(result.get("receipt"), expect, outs)
        except ReceiptError as exc:
            raise error_for_reason(exc.reason, f"{expect.provider_id[:16]}…: {exc}") from exc
        verified = []
        for i, ((expert, _), sketch) in enumerate(zip(batches, sketches, strict=True)):
            commitment = batch_commitment(receipt.commitment_hash, i)
            kept = self._keep(commitment)
            verified.append(VerifiedBatch(receipt, kept, sketch if kept else None, body if kept else None,
                                          commitment, expect.layer, expert, i))
        return [out for out, _ in outs], [n * row_bytes for n in counts], verified

    def _accept(self, result: dict[str, Any], answer: bytes | bytearray, body: bytes,
                expect: Expected) -> tuple[np.ndarray, VerifiedBatch]:
        """Decode the answer's rows and verify its receipt against them (on the codec executor)."""
        out = self._decode(result, answer, expect.input_encoding, len(expect.token_indices))
        expect = dataclasses.replace(expect, input_hash=blake3_hex(body))
        try:
            receipt, sketch = verify_receipt(result.get("receipt"), expect, out, answer)
        except ReceiptError as exc:
            raise error_for_reason(exc.reason, f"{expect.provider_id[:16]}…: {exc}") from exc
        batch = (receipt.commitment_hash, expect.layer, expect.expert)
        if self._keep(receipt.commitment_hash):
            return out, VerifiedBatch(receipt, True, sketch, body, *batch)
        return out, VerifiedBatch(receipt, False, None, None, *batch)

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
            response = await self._http().post(url, content=request_frame("moe/execute", params, body),
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


def _carrier(calls: list[tuple[int, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, list[int], list[list[int]]]:
    """A multi-expert request's carrier: each token's row once, f32 [n_unique, d_model], ascending by token;
    those tokens; and each batch's rows as positions into it. Tokens ascend within a batch and a token's row
    is the same in every batch. A decode step's batches all carry the same token or few: then one batch's
    rows are the carrier, found without numpy's set operations (which cost more than the rows)."""
    tokens = [t.tolist() for _, _, t in calls]
    union = sorted(set().union(*tokens))
    index = {t: i for i, t in enumerate(union)}
    positions = [[index[t] for t in batch] for batch in tokens]
    whole = next((i for i, batch in enumerate(tokens) if len(batch) == len(union)), None)
    if whole is not None:  # one batch holds every token of the request
        return calls[whole][1], union, positions
    first = {}  # token -> (batch, row) where it first appears
    for b, batch in enumerate(tokens):
        for r, t in enumerate(batch):
            first.setdefault(t, (b, r))
    return np.stack([calls[b][1][r] for b, r in (first[t] for t in union)]), union, positions


def _seconds(compute_ms: Any) -> float | None:
    """A holder's reported compute_ms in seconds, None when absent or not a non-negative number."""
    ok = isinstance(compute_ms, int | float) and not isinstance(compute_ms, bool) and compute_ms >= 0
    return compute_ms / 1000.0 if ok else None
