"""Who may generate now: a bound on running sequences and on their KV caches' bytes, a bounded queue.

A router's running generations share its cores and its memory. Each asks, when it arrives, for the
KV cache its whole length may take (prompt + max_new_tokens positions, every layer: the cache is
allocated for that length at once, so the bytes are the ones it will hold). It runs at once when a
slot is free and its bytes fit under the KV budget beside the running ones'; otherwise it waits in a
first-come first-served queue, and only when the queue is full is it turned away (`busy`, 429).
A request that could never fit, even alone, is refused with `kv_budget_exceeded` naming its bytes
and the budget, before anything of it starts.

Pure asyncio: no Django. The budget is a callable, read at each decision: it is the node's memory
budget less the dense weights it holds, which change as models are loaded.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

from apps.generation.batcher import Seat, StepBatcher
from core.errors import PayloadTooLarge, RateLimited


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


class Ticket:
    """One generation's place: admitted at once, or queued until `admitted()` returns. `release()`
    gives its slot and bytes back (or leaves the queue), exactly once, however the generation ended."""

    def __init__(self, admission: Admission, kv_bytes: int) -> None:
        self._admission, self.kv_bytes = admission, kv_bytes
        self._event = asyncio.Event()
        self._released = False

    @property
    def is_admitted(self) -> bool:
        return self._event.is_set()

    async def admitted(self) -> None:
        await self._event.wait()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release(self)


class Admission:
    def __init__(self, *, max_running: int, max_queued: int, kv_budget: Callable[[], int],
                 on_change: Callable[[int], None] = lambda used: None) -> None:
        """on_change(kv bytes held by the running): called whenever that changes (the node reserves
        them in its memory budget, so experts in the memory tier make room)."""
        self.max_running, self.max_queued = max_running, max_queued
        self._kv_budget, self._on_change = kv_budget, on_change
        self.running: set[Ticket] = set()
        self.queue: collections.deque[Ticket] = collections.deque()

    @property
    def kv_bytes_running(self) -> int:
        return sum(t.kv_bytes for t in self.running)

    def _fits(self, ticket: Ticket) -> bool:
        return len(self.running) < self.max_running and \
            self.kv_bytes_running + ticket.kv_bytes <= self._kv_budget()

    def ticket(self, kv_bytes: int) -> Ticket:
        """A place for a generation needing `kv_bytes` of KV cache. PayloadTooLarge (kv_budget_exceeded)
        when it cannot fit even alone; RateLimited (busy) when it would have to wait and the queue is full."""
        budget = self._kv_budget()
        if kv_bytes > budget:
            raise PayloadTooLarge(
                f"this generation's KV cache needs {_mib(kv_bytes)} (its prompt and max_new_tokens, every layer), "
                f"more than this router's KV budget of {_mib(budget)} (its memory budget less the dense weights it "
                "holds, or TENZRO_GENERATE_KV_BUDGET_BYTES): ask for fewer tokens", reason="kv_budget_exceeded",
                param="max_new_tokens", kv_bytes=kv_bytes, kv_budget_bytes=budget)
        ticket = Ticket(self, kv_bytes)
        if not self.queue and self._fits(ticket):
            self._admit(ticket)
        elif len(self.queue) < self.max_queued:
            self.queue.append(ticket)
        else:
            raise RateLimited(f"{len(self.running)} generations are running on this router and {len(self.queue)} "
                              "are waiting (TENZRO_GENERATE_MAX_CONCURRENT, TENZRO_GENERATE_QUEUE); try again when "
                              "one ends", reason="busy")
        return ticket

    def _admit(self, ticket: Ticket) -> None:
        self.running.add(ticket)
        ticket._event.set()
        self._on_change(self.kv_bytes_running)

    def _release(self, ticket: Ticket) -> None:
        if ticket in self.running:
            self.running.discard(ticket)
            self._on_change(self.kv_bytes_running)
        elif ticket in self.queue:
            self.queue.remove(ticket)
        # first come, first served: the head waits until it fits, however small the ones behind it
        while self.queue and self._fits(self.queue[0]):
            self._admit(self.queue.popleft())


class Place:
    """A generation's place on this router: its admission ticket, then, once admitted, its seat in its
    model's batch (a queued generation takes no seat: the batch would wait for its step at every
    iteration). `leave` gives both back, once, however the generation ended."""

    def __init__(self, batcher: StepBatcher, ticket: Ticket, model_id: str, model: Any,
                 options: dict[str, Any]) -> None:
        self._batcher, self._ticket = batcher, ticket
        self._model_id, self._model, self._options = model_id, model, options
        self._seat: Seat | None = None
        self._left = False

    async def step(self, *args: Any) -> Any:
        if self._seat is None:
            await self._ticket.admitted()
            if self._left:
                raise asyncio.CancelledError
            self._seat = self._batcher.seat(self._model_id, self._model, self._options)
        return await self._seat.step(*args)

    def leave(self) -> None:
        if not self._left:
            self._left = True
            if self._seat is not None:
                self._seat.leave()
            self._ticket.release()
