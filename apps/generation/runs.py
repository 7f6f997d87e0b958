"""One generation running in the expert worker: steps over the network, token choice, text, events, records.

`GenerationRun.run()` is the task `moe/generate` starts. Each step is one whole-model forward (every
MoE layer through the distributed forward), then the sampler picks the token; the token and the text it
completes go out on the request's stream at once (apps/worker/streams.py), while the records are written
in batches off the step's path. It ends at max_new_tokens ("length"), an end-of-sequence token or a stop
string ("stop"), a cancel ("cancelled": the client left, or the operator stopped it), or an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from django.conf import settings

from apps.forward.ledger import ForwardWork
from apps.generation import services
from apps.generation.requests import GenerateRequest
from apps.generation.sampling import Sampler
from apps.generation.text import CompletionText, TextCodec
from apps.worker.doors import CallContext, Door
from apps.worker.streams import EventStream
from core.errors import TenzroError, Unavailable

logger = logging.getLogger("tenzro.generation")
Step = Callable[..., Awaitable[tuple[np.ndarray, list[dict[str, Any]], float]]]
Write = Callable[..., asyncio.Future]


class GenerationRun:
    def __init__(self, *, generation_id: str, model_id: str, model: Any, codec: TextCodec | None,
                 eos_ids: frozenset[int], request: GenerateRequest, step: Step, write: Write,
                 record_work: Callable[..., None], received_at: float | None = None,
                 steps_done: Callable[[], None] = lambda: None, prefill_chunk: int = 0,
                 write_steps: Callable[..., None] | None = None) -> None:
        """received_at: time.monotonic() when the router got the request: time to first token counts from
        there (its prompt tokenized and checked, any wait for admission, then the prefill), as a client sees
        it, and so does its deadline (request.deadline_s). steps_done: called once it asks for no more steps
        (before its record is closed): its batch stops waiting for it. prefill_chunk: the prompt goes through
        in steps of at most this many tokens (0: one step), so the others' decoding goes on beside it.
        write_steps(generation_id=, steps=, ttft_ms=): hands a batch of steps to the record writer
        (apps/generation/records.py); by default a write of services.generation_steps."""
        self.received_at = time.monotonic() if received_at is None else received_at
        self.generation_id, self.model_id, self.model = generation_id, model_id, model
        self.codec, self.eos_ids, self.request = codec, eos_ids, request
        self._step, self._write, self._record_work, self._steps_done = step, write, record_work, steps_done
        self._prefill_chunk = prefill_chunk
        self._write_steps = write_steps or (lambda **kwargs: write(services.generation_steps, **kwargs))
        self.sampler = Sampler(request.sampling, request.prompt_ids)
        self.text = CompletionText(codec, request.stop) if codec is not None else None
        self.stream = EventStream(request.stream)
        self.tokens: list[int] = []
        self.cancel_requested = False  # checked before each step: a CancelledError some await swallowed still ends it
        self._pending: list[dict[str, Any]] = []  # steps not yet written to the record
        self._written_at = 0.0

    def _flush(self, ttft_ms: float | None = None) -> None:
        if self._pending:  # a new list each time: the database thread owns the one it was handed
            self._write_steps(generation_id=self.generation_id, steps=self._pending, ttft_ms=ttft_ms)
        self._pending, self._written_at = [], time.monotonic()

    def _token_event(self, index: int, token: int, delta: str, choice: Any) -> dict[str, Any]:
        event: dict[str, Any] = {"type": "token", "index": index, "token": token, "text": delta}
        if choice.logprob is not None:
            event["logprob"] = choice.logprob
            event["top"] = [[t, lp, self._piece(t)] for t, lp in choice.top]
            event["piece"] = self._piece(token)
        return event

    def cancel(self, task: asyncio.Task) -> None:
        """Stop this run (the task running it): it ends within one step, its record `cancelled`."""
        self.cancel_requested = True
        task.cancel()

    def _piece(self, token: int) -> str:
        """One token's own text, as logprobs show it."""
        return self.codec.tokenizer.decode([token], skip_special_tokens=False) if self.codec is not None else ""

    async def _forward(self, ids: np.ndarray, cache: Any, ctx: CallContext, work: ForwardWork
                       ) -> tuple[np.ndarray, list[dict[str, Any]], float]:
        """One token's step: the last position's logits of `ids` (a prompt in chunks of prefill_chunk)."""
        chunk = self._prefill_chunk or len(ids)
        layers: list[dict[str, Any]] = []
        dense_s = 0.0
        for at in range(0, len(ids), chunk):
            logits, part, seconds = await self._step(self.model_id, self.model, ids[at: at + chunk], cache,
                                                     self.request.options, ctx, work)
            layers += part
            dense_s += seconds
        return logits, layers, dense_s

    async def run(self) -> None:
        ctx = CallContext(door=Door.OPERATOR)
        request = self.request
        # its whole length at once: the bytes admission counted, and no copy as it grows
        cache = self.model.new_cache(len(request.prompt_ids) + request.max_new_tokens)
        decode_started, decoded = 0.0, 0
        ids = np.asarray(request.prompt_ids, dtype=np.int64)
        work = ForwardWork()  # the whole generation's: one settlement per holder, written at the end
        finish, error = "length", None
        # on the loop's clock, from when the router got the request (the queue's wait counts)
        deadline = asyncio.get_running_loop().time() + request.deadline_s - (time.monotonic() - self.received_at)
        try:
            for index in range(request.max_new_tokens):
                if self.cancel_requested:
                    raise asyncio.CancelledError
                step_started = time.monotonic()
                try:
                    async with asyncio.timeout_at(deadline):
                        logits, layers, dense_s = await self._forward(ids, cache, ctx, work)
                except TimeoutError:
                    raise Unavailable(f"the generation ran past its deadline of {request.deadline_s:g} s "
                                      f"(deadline_s, TENZRO_GENERATE_DEADLINE_S) after {len(self.tokens)} token(s)",
                                      reason="deadline_exceeded") from None
                choice = self.sampler.choose(logits[-1])
                token = choice.token
                self.tokens.append(token)
                ended_by_eos = request.options["stop_at_eos"] and token in self.eos_ids
                delta = self.text.add(token) if self.text is not None and not ended_by_eos else ""
                await self.stream.put(self._token_event(index, token, delta, choice))
                now = time.monotonic()
                self._pending.append({"index": index, "phase": "prefill" if index == 0 else "decode",
                                      "tokens_in": len(ids), "token": token, "text": delta,
                                      "ms": round((now - step_started) * 1000.0, 3),
                                      "dense_ms": round(dense_s * 1000.0, 3), "layers": layers})
                if index == 0:
                    decode_started = now
                    self._flush(ttft_ms=round((now - self.received_at) * 1000.0, 3))
                else:
                    decoded += 1
                    if now - self._written_at >= settings.TENZRO_GENERATION_RECORD_INTERVAL_S:
                        self._flush()
                if ended_by_eos or (self.text is not None and self.text.stopped):
                    finish = "stop"
                    break
                ids = np.array([token], dtype=np.int64)
        except asyncio.CancelledError:
            finish = "cancelled"
        except TenzroError as exc:
            finish, error = "error", {"reason": exc.reason, "message": exc.message}
        except Exception as exc:  # a bug must still end the record, not leave it running
            logger.exception("generation %s failed", self.generation_id)
            finish, error = "error", {"reason": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
        finally:  # one settlement per holder for the whole generation, its id the generation's
            self._record_work(model_id=self.model_id, forward_id=self.generation_id, work=work)
        rate = decoded / (time.monotonic() - decode_started) if decoded else None
        await self._end(finish, error, None if rate is None else round(rate, 3))

    async def _end(self, finish: str, error: dict[str, str] | None, rate: float | None) -> None:
        self._steps_done()
        tail = self.text.flush() if self.text is not None else ""
        self._flush()
        usage = {"prompt_tokens": len(self.request.prompt_ids), "completion_tokens": len(self.tokens)}
        await self.stream.put({"type": "end", "finish_reason": finish, "text": tail, "usage": usage, "error": error})
        try:
            await asyncio.shield(self._write(
                services.generation_finish, generation_id=self.generation_id, decode_tokens_per_s=rate,
                finish_reason=finish, text=self.text.text if self.text is not None else "",
                error_reason=error["reason"] if error else "", error_message=error["message"] if error else ""))
        finally:  # the end event leaves even when the record cannot be written (that is logged by the write)
            await self.stream.close()
