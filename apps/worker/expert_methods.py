"""The expert worker's `moe/*` methods over its runtime (core/experts/runtime.py).

Which door serves each of them is decided in apps/worker/doors.py, not here; their params
are read by apps/worker/params.py. Compute and payload decoding run on the executor through
the call's context, so a call whose caller gave up is dropped before it computes. Runtime errors are application errors
(core/errors.py) and travel back with their reason.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from apps.worker.params import batches_param, encoded_rows_param, hidden_param, int_param, str_param
from core.errors import InvalidInput, NotFound, PayloadTooLarge
from core.experts.runtime import ExpertRuntime
from core.formats.wire import WIRE_CODECS, encode_rows, encoded_row_bytes, rows_to_bytes

Result = tuple[dict[str, Any], bytes]
MAX_RECEIPT_TOPK = 1024  # features committed per row; more is a receipt as large as the answer


class Context(Protocol):
    """What a handler needs of its call's context (apps/worker/doors.CallContext)."""

    async def run_blocking(self, executor: Executor, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any: ...

    def run_inline(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Payload:
    """Payload bytes (a request body is passed on as received, not copied), and the file that
    already holds exactly them (a blob), if any."""

    data: bytes | bytearray
    stored_at: Path | None = None


def _timed(func: Callable[..., np.ndarray], /, **kwargs: Any) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    return func(**kwargs), time.perf_counter() - started


def _token_indices(params: dict[str, Any], tokens: int) -> list[int]:
    """The batch's token indices in the router's forward (the receipt's token set); 0..n-1 if absent."""
    value = params.get("token_indices")
    if value is None:
        return list(range(tokens))
    if not isinstance(value, list) or len(value) != tokens or any(
            isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in value):
        raise InvalidInput(f"param 'token_indices' must be a list of {tokens} non-negative integers (one per row)")
    return value


def _frame_rows(params: dict[str, Any]) -> int:
    """Rows a multi-expert frame asks to compute, all batches together; 0 when its `batches` are
    malformed (the frame then goes the usual way, and prepare() says what is wrong)."""
    batches = params.get("batches")
    if not isinstance(batches, list):
        return 0
    rows = [b.get("rows") for b in batches if isinstance(b, dict)]
    return sum(len(r) for r in rows) if len(rows) == len(batches) and all(isinstance(r, list) for r in rows) else 0


def _receipt_k(params: dict[str, Any], default: int) -> int:
    value = params.get("receipt_topk", default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RECEIPT_TOPK:
        raise InvalidInput(f"param 'receipt_topk' must be an integer in [1, {MAX_RECEIPT_TOPK}], got {value!r}")
    return value


def read_regular_file(path: str, *, max_bytes: int, what: str) -> bytes:
    """A node-local payload file: regular files only, at most `max_bytes` (read bounded)."""
    try:
        info = os.stat(path)
    except FileNotFoundError as exc:
        raise NotFound(f"{what} payload file {path} does not exist on this node", reason="file_not_found") from exc
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise InvalidInput(f"cannot read {what} payload file {path!r}: {getattr(exc, 'strerror', None) or exc}",
                           reason="unreadable_file") from exc
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"{what} payload {path} is not a regular file", reason="not_a_file")
    if info.st_size > max_bytes:
        raise PayloadTooLarge(f"{what} payload file {path} has {info.st_size} bytes, more than the "
                              f"{max_bytes} of TENZRO_BLOB_MAX_BYTES", limit_bytes=max_bytes)
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)  # bounded even if the file grows meanwhile
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} payload file {path}: {exc.strerror}",
                           reason="unreadable_file") from exc
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"{what} payload file {path} grew past {max_bytes} bytes", limit_bytes=max_bytes)
    return data


class ExpertHandlers:
    """moe/* handlers bound to one runtime and one executor."""

    def __init__(
        self,
        *,
        runtime: ExpertRuntime,
        executor: Executor,
        max_payload_bytes: int,
        resolve_blob: Callable[[str], Payload] | None = None,
        after_change: Callable[[], Awaitable[None]] | None = None,
        sign_receipt: Any = None,
        receipt_topk: int = 16,
        max_answer_bytes: int | None = None,
        accept_batches: bool = True,
        inline_rows: int = 0,
    ) -> None:
        """`resolve_blob(uri)` returns a blob's verified bytes (local store or a peer); it may block.
        `after_change()` is awaited after a load or unload, before the answer (the control plane
        publishes the new holdings there, so a read after the answer sees them).
        `sign_receipt(...)` (apps.receipts.commitment.ReceiptSigner) signs each execute's receipt (its
        `.batches(...)` a multi-expert answer's); without it this holder serves receiptless, and
        remote routers refuse its answers. `max_answer_bytes` bounds a multi-expert answer (the rows
        of every batch; default `max_payload_bytes`). `inline_rows`: a multi-expert frame of at most
        this many rows in all runs on the event loop itself while no other one computes (0: never;
        see _execute_batches)."""
        self.runtime = runtime
        self._sign_receipt = sign_receipt
        self._receipt_topk = receipt_topk
        self._executor = executor
        self._max_payload = max_payload_bytes
        self._resolve_blob = resolve_blob
        self._after_change = after_change
        self._max_answer = max_answer_bytes or max_payload_bytes
        self._accept_batches = accept_batches  # false: one expert per request, as before the multi-expert frame
        self._inline_rows = inline_rows
        self._frames_on_threads = 0  # multi-expert frames handed to the compute threads and not yet done

    def table(self) -> dict[str, Callable[..., Awaitable[Result]]]:
        return {
            "moe/expert_load": self.expert_load,
            "moe/expert_unload": self.expert_unload,
            "moe/gate_load": self.gate_load,
            "moe/gate_unload": self.gate_unload,
            "moe/expert_status": self.expert_status,
            "moe/route": self.route,
            "moe/execute": self.execute,
            "moe/forward_local": self.forward_local,
        }

    async def _changed(self) -> None:
        if self._after_change is not None:
            await self._after_change()

    @staticmethod
    def _expected(params: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        return {name: params[name] for name in names if params.get(name) is not None}

    async def _payload(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context, what: str) -> Payload:
        """The payload: the request body, a regular file on this node (`path`), or a blob (`blob_uri`)."""
        if body:
            if len(body) > self._max_payload:
                raise PayloadTooLarge(f"{what} payload of {len(body)} bytes exceeds {self._max_payload}",
                                      limit_bytes=self._max_payload)
            return Payload(body)
        path, uri = params.get("path"), params.get("blob_uri")
        if isinstance(path, str) and path:
            data = await ctx.run_blocking(self._executor, read_regular_file, path, max_bytes=self._max_payload,
                                          what=what)
            return Payload(data)
        if isinstance(uri, str) and uri and self._resolve_blob is not None:
            return await ctx.run_blocking(self._executor, self._resolve_blob, uri)
        raise InvalidInput(f"no {what} payload: send it as the body, or name a path or blob_uri")

    async def expert_load(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context) -> Result:
        expect = self._expected(params, ("model_id", "layer", "expert"))
        payload = await self._payload(params, body, ctx, "expert")
        row = await ctx.run_blocking(self._executor, self.runtime.expert_load, payload=payload.data,
                                     blob_uri=params.get("blob_uri"), expect=expect, stored_at=payload.stored_at)
        await self._changed()
        return row, b""

    async def expert_unload(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context) -> Result:
        await ctx.run_blocking(self._executor, self.runtime.expert_unload, model_id=str_param(params, "model_id"),
                               layer=int_param(params, "layer"), expert=int_param(params, "expert"))
        await self._changed()
        return {"unloaded": True}, b""

    async def gate_load(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context) -> Result:
        expect = self._expected(params, ("model_id", "layer"))
        payload = await self._payload(params, body, ctx, "gate")
        row = await ctx.run_blocking(self._executor, self.runtime.gate_load, payload=payload.data,
                                     blob_uri=params.get("blob_uri"), expect=expect, stored_at=payload.stored_at)
        await self._changed()
        return row, b""

    async def gate_unload(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context) -> Result:
        await ctx.run_blocking(self._executor, self.runtime.gate_unload, model_id=str_param(params, "model_id"),
                               layer=int_param(params, "layer"))
        await self._changed()
        return {"unloaded": True}, b""

    async def expert_status(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context) -> Result:
        status = await ctx.run_blocking(self._executor, self.runtime.status)
        return {**status, "worker_pid": os.getpid()}, b""

    async def route(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context) -> Result:
        routing = await ctx.run_blocking(self._executor, self.runtime.route, model_id=str_param(params, "model_id"),
                                         layer=int_param(params, "layer"), hidden=hidden_param(params, body))
        return {"experts": routing.experts.tolist(), "weights": routing.weights.tolist()}, b""

    async def execute(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context) -> Result:
        """One expert over the body's rows. `encoding` (default f32) names the body's codec, and the
        answer's rows travel in the same one (docs/protocol.md, "Activation codecs"). The answer
        carries a signed receipt over the exact body and the answer's rows ("Receipts")."""
        encoding = params.get("encoding", "f32")
        if encoding not in WIRE_CODECS:
            raise InvalidInput(f"param 'encoding' must be one of {list(WIRE_CODECS)}, got {encoding!r}",
                               reason="unsupported_encoding")
        if "batches" in params and self._accept_batches:
            return await self._execute_batches(params, body, ctx, encoding)
        model_id, layer, expert = str_param(params, "model_id"), int_param(params, "layer"), int_param(params, "expert")
        if encoding == "f32":
            hidden = hidden_param(params, body)
        else:
            hidden = await ctx.run_blocking(self._executor, encoded_rows_param, params, body, encoding)
        token_indices = _token_indices(params, len(hidden))
        k = _receipt_k(params, self._receipt_topk)
        timed = await ctx.run_blocking(self._executor, _timed, self.runtime.execute, model_id=model_id, layer=layer,
                                       expert=expert, hidden=hidden)
        out, compute_s = timed

        def answer() -> tuple[bytes, dict[str, Any] | None]:
            data = rows_to_bytes(out) if encoding == "f32" else encode_rows(out, encoding)
            if self._sign_receipt is None:
                return data, None
            return data, self._sign_receipt(model_id=model_id, layer=layer, expert=expert,
                                            token_indices=token_indices, d_model=int(out.shape[1]),
                                            input_encoding=encoding, input_carrier=body, output_encoding=encoding,
                                            answer=data, k=k)

        data, receipt = await ctx.run_blocking(self._executor, answer)
        # compute_ms lets a router tell the wire's share of a call's latency from the holder's own
        result = {"tokens": int(out.shape[0]), "d_model": int(out.shape[1]), "encoding": encoding,
                  "compute_ms": round(compute_s * 1000.0, 3)}
        if receipt is not None:
            result["receipt"] = receipt
        return result, data

    async def _execute_batches(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context,
                               encoding: str) -> Result:
        """Several experts of one layer over one carrier of rows (docs/protocol.md, "Multi-expert execute"):
        the body's rows once, `batches` [{expert, rows}] naming each expert's rows among them. The
        answer's body is each batch's output rows in order; one v2 receipt covers them all. A frame
        that is wrong anywhere (an expert twice, rows out of range, an expert not held, an answer
        over the limit) is refused whole, before anything is computed.

        The frame runs as one compute job: a decode step's few rows cost less than a thread hop, and
        a large frame's matmuls already use every core (BLAS, the C kernels' own threads): measured
        with bench/forward.py, spreading its experts over the compute threads as well was slower.
        A frame of at most `inline_rows` rows, arriving while no other frame computes, runs on the
        event loop itself: on a busy machine the hop to a compute thread and back costs the loop a
        wake-up and a GIL hand-off each way, about what such a frame's compute costs
        (docs/performance.md, "A decode step's frame on the holder's own loop"). Frames that arrive
        together still go to the threads, which compute them in parallel."""
        if "expert" in params:
            raise InvalidInput("give either 'expert' (one batch) or 'batches' (several), not both")
        model_id, layer = str_param(params, "model_id"), int_param(params, "layer")
        k = _receipt_k(params, self._receipt_topk)

        def prepare() -> tuple[np.ndarray, list[tuple[int, list[int]]], list[int]]:
            hidden = hidden_param(params, body) if encoding == "f32" else encoded_rows_param(params, body, encoding)
            batches = batches_param(params, len(hidden))
            answer_bytes = sum(len(rows) for _, rows in batches) * encoded_row_bytes(encoding, hidden.shape[1])
            if answer_bytes > self._max_answer:
                raise PayloadTooLarge(f"the answer to {len(batches)} batches would be {answer_bytes} bytes, more "
                                      f"than the {self._max_answer} this holder sends in one answer",
                                      limit_bytes=self._max_answer)
            return hidden, batches, _token_indices(params, len(hidden))

        def compute(hidden: np.ndarray, batches: list[tuple[int, list[int]]]
                    ) -> tuple[bytes, list[memoryview], list[float]]:
            """(the answer's body, each batch's part of it, each batch's compute seconds). Every batch's
            rows are encoded in one call: the codecs work row by row, so the parts are the bytes each
            batch alone would give, and a decode step's eight one-row calls cost more than their rows."""
            outs = self.runtime.execute_carrier(model_id=model_id, layer=layer, hidden=hidden, batches=batches)
            data = encode_rows(np.concatenate([out for out, _ in outs]), encoding)
            row_bytes = encoded_row_bytes(encoding, hidden.shape[1])
            ends = list(accumulate(len(rows) * row_bytes for _, rows in batches))
            view = memoryview(data)
            return data, [view[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)], [s for _, s in outs]

        def answer(hidden: np.ndarray, batches: list[tuple[int, list[int]]], token_indices: list[int],
                   done: tuple[bytes, list[memoryview], list[float]]) -> Result:
            data, parts, seconds = done
            result: dict[str, Any] = {
                "d_model": int(hidden.shape[1]), "encoding": encoding,
                "batches": [{"expert": e, "tokens": len(rows), "compute_ms": round(s * 1000.0, 3)}
                            for (e, rows), s in zip(batches, seconds, strict=True)],
                "compute_ms": round(sum(seconds) * 1000.0, 3)}
            if self._sign_receipt is not None:
                result["receipt"] = self._sign_receipt.batches(
                    model_id=model_id, layer=layer, token_indices=token_indices, d_model=int(hidden.shape[1]),
                    input_encoding=encoding, input_carrier=body, output_encoding=encoding, k=k,
                    batches=[(e, rows, part) for (e, rows), part in zip(batches, parts, strict=True)])
            return result, data

        def whole() -> Result:
            hidden, batches, token_indices = prepare()
            return answer(hidden, batches, token_indices, compute(hidden, batches))

        if self._frames_on_threads == 0 and 0 < _frame_rows(params) <= self._inline_rows:
            return ctx.run_inline(whole)
        self._frames_on_threads += 1
        try:
            return await ctx.run_blocking(self._executor, whole)
        finally:
            self._frames_on_threads -= 1

    async def forward_local(self, params: dict[str, Any], body: bytes | bytearray, ctx: Context) -> Result:
        out = await ctx.run_blocking(self._executor, self.runtime.forward_local,
                                     model_id=str_param(params, "model_id"), layer=int_param(params, "layer"),
                                     hidden=hidden_param(params, body))
        return {"tokens": int(out.shape[0]), "d_model": int(out.shape[1])}, rows_to_bytes(out)
