"""Continuous batching on the router: the steps a model's running generations ask for at the same time
run as one step of all their sequences (WholeModel.run_batch: the dense part's matrix products over all
their rows, attention per sequence over its own cache), so each MoE layer is one plan and one dispatch
for all of their rows: one request per holder per layer per iteration, whatever the number of clients.

Each generation takes a seat in its model's batch (`StepBatcher.seat`) and asks for its steps with
`Seat.step`, which answers with its own logits. An iteration starts once every seated generation has
asked (between steps each samples its token, well under a millisecond), or `wait_s` after the first
ask, so a slow one never holds the others up; sequences join and leave between iterations, a new
one's prefill beside the others' decodes. A seat is left when its generation ends, however it ends.

The holders' work of an iteration is paid once: it goes into the ledger of one generation of the
iteration that is still running (its settlement covers it), or, if none is, is recorded on its own.

Pure asyncio: no Django.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.forward.ledger import ForwardWork

StepResult = tuple[np.ndarray, list[dict[str, Any]], float]  # logits, the layers' stats, dense seconds
Drive = Callable[[str, Generator, dict[str, Any], Any, ForwardWork], Awaitable[tuple[Any, list[dict[str, Any]], float]]]


@dataclass(frozen=True)
class Iteration:
    """One step of a model's batch: when it ended (time.monotonic()), its sequences, their rows, its ms."""
    model_id: str
    ended_at: float
    batch: int
    rows: int
    ms: float


@dataclass
class _Ask:
    ids: np.ndarray
    cache: Any
    ctx: Any
    work: ForwardWork
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class _ModelBatch:
    """The seated generations of one model with one set of forward options, and the task stepping them."""

    def __init__(self, batcher: StepBatcher, key: tuple[Any, ...], model: Any, options: dict[str, Any]) -> None:
        self.batcher, self.key, self.model, self.options = batcher, key, model, options
        self.seated = 0
        self.asks: list[_Ask] = []
        self.changed = asyncio.Event()  # an ask, or a seat left
        self.task: asyncio.Task | None = None

    def ask(self, ask: _Ask) -> None:
        self.asks.append(ask)
        self.changed.set()
        if self.task is None:
            self.task = asyncio.create_task(self._serve())

    async def _gathered(self) -> None:
        """Until every seated generation has asked, or wait_s has passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.batcher.wait_s):
                while len(self.asks) < self.seated:
                    self.changed.clear()
                    await self.changed.wait()

    async def _serve(self) -> None:
        try:
            while self.asks:
                await self._gathered()
                asks = [a for a in self.asks if not a.future.done()]
                taken = self._within_rows(asks)
                self.asks = asks[len(taken):]  # past the row limit: the next iteration, first in line
                if taken:
                    await self._iteration(taken)
        finally:
            self.task = None  # the next ask starts another (no await between the loop's end and here)

    def _within_rows(self, asks: list[_Ask]) -> list[_Ask]:
        """The first asks, in order, whose rows fit the iteration's limit (always the first, whatever its size)."""
        rows = 0
        for n, a in enumerate(asks):
            rows += len(a.ids)
            if n and rows > self.batcher.max_rows:
                return asks[:n]
        return asks

    async def _iteration(self, asks: list[_Ask]) -> None:
        model_id = self.key[0]
        work = ForwardWork()
        started = time.monotonic()
        try:
            step = self.model.run_batch([(a.ids, a.cache) for a in asks], last_only=True)
            results, layers, dense_s = await self.batcher.drive(model_id, step, self.options,
                                                                asks[0].ctx, work)
        except asyncio.CancelledError:
            for a in asks:
                a.future.cancel()
            raise
        except Exception as exc:  # the whole step failed (a layer could not be served): each sequence hears it
            for a in asks:
                if not a.future.done():
                    a.future.set_exception(exc)
            return
        finally:
            self._settle(model_id, work, asks)
            self.batcher.iterations.append(Iteration(model_id=model_id, ended_at=time.monotonic(), batch=len(asks),
                                                     rows=sum(len(a.ids) for a in asks),
                                                     ms=round((time.monotonic() - started) * 1000.0, 3)))
            self.batcher.on_iteration()
        stats = [{**layer, "batch": len(asks)} for layer in layers]
        for a, logits in zip(asks, results, strict=True):
            if not a.future.done():
                a.future.set_result((logits, stats, dense_s))

    def _settle(self, model_id: str, work: ForwardWork, asks: list[_Ask]) -> None:
        live = next((a.work for a in asks if not a.future.done()), None)
        if live is not None:
            live.absorb(work)
        elif work:
            self.batcher.record_work(model_id=model_id, forward_id=uuid.uuid4().hex, work=work)


class Seat:
    """One generation's place in its model's batch."""

    def __init__(self, batch: _ModelBatch) -> None:
        self._batch = batch
        batch.seated += 1
        self._left = False

    async def step(self, model_id: str, model: Any, ids: np.ndarray, cache: Any, options: dict[str, Any],
                   ctx: Any, work: ForwardWork) -> StepResult:
        """This generation's next step (the last position's logits), run with whoever asks at the same time."""
        ask = _Ask(ids=ids, cache=cache, ctx=ctx, work=work)
        self._batch.ask(ask)
        try:
            return await ask.future
        finally:
            if not ask.future.done():  # cancelled while waiting: it is skipped when the iteration starts
                ask.future.cancel()

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self._batch.seated -= 1
            self._batch.changed.set()
            if self._batch.seated == 0 and not self._batch.asks and self._batch.task is None:
                self._batch.batcher.forget(self._batch)


class StepBatcher:
    """The batches of a router's running generations, one per (model, forward options)."""

    def __init__(self, drive: Drive, record_work: Callable[..., None], *, wait_s: float, max_rows: int = 512,
                 on_iteration: Callable[[], None] = lambda: None) -> None:
        """max_rows: the most rows (tokens) one iteration carries; the asks past it wait for the next.
        on_iteration: called after each iteration (the live view's cue)."""
        self.drive, self.record_work, self.wait_s, self.max_rows = drive, record_work, wait_s, max_rows
        self.on_iteration = on_iteration
        self._batches: dict[tuple[Any, ...], _ModelBatch] = {}
        self.iterations: collections.deque[Iteration] = collections.deque(maxlen=4096)  # the recent, newest last

    def seat(self, model_id: str, model: Any, options: dict[str, Any]) -> Seat:
        key = (model_id, id(model), options.get("wire"), options.get("allow_partial"))
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = _ModelBatch(self, key, model, options)
        return Seat(batch)

    def view(self, *, window_s: float, shown: int) -> dict[str, Any]:
        """The live view's half: the newest `shown` iterations (oldest first) and the tokens per second
        of the last `window_s` seconds (each sequence of an iteration steps once: its batch size)."""
        now = time.monotonic()
        recent = list(self.iterations)[-shown:]
        in_window = [it.batch for it in self.iterations if now - it.ended_at <= window_s]
        return {"tokens_per_s": round(sum(in_window) / window_s, 3), "window_s": window_s,
                "iterations": [{"model_id": it.model_id, "batch": it.batch, "rows": it.rows, "ms": it.ms,
                                "ago_s": round(now - it.ended_at, 3)} for it in recent]}

    def forget(self, batch: _ModelBatch) -> None:
        if self._batches.get(batch.key) is batch:
            del self._batches[batch.key]
