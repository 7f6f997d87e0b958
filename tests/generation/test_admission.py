"""Admission (apps/generation/admission.py): slots and KV cache bytes bound who runs; the rest wait first
come first served in a bounded queue; busy only when it is full; a request too big even alone is refused."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from apps.forward.ledger import ForwardWork
from apps.generation.admission import Admission, Place
from apps.generation.batcher import StepBatcher
from core.errors import PayloadTooLarge, RateLimited


def _admission(*, running=2, queued=2, budget=100):
    changes = []
    return Admission(max_running=running, max_queued=queued, kv_budget=lambda: budget, on_change=changes.append), \
        changes


def test_within_slots_and_bytes_a_generation_runs_at_once_and_its_release_gives_them_back() -> None:
    admission, changes = _admission()
    a, b = admission.ticket(40), admission.ticket(60)
    assert a.is_admitted and b.is_admitted and admission.kv_bytes_running == 100
    a.release()
    a.release()  # once only
    assert admission.kv_bytes_running == 60 and changes == [40, 100, 60]


def test_past_the_slots_or_the_bytes_it_waits_first_come_first_served() -> None:
    admission, _ = _admission(running=2, queued=3, budget=100)
    running = [admission.ticket(50), admission.ticket(10)]
    by_bytes = admission.ticket(60)  # a slot is free, the bytes are not
    small = admission.ticket(1)  # fits, but waits behind the head: no overtaking
    assert not by_bytes.is_admitted and not small.is_admitted
    running[0].release()  # 10 + 60 fit, and the slots: both admitted
    assert by_bytes.is_admitted and not small.is_admitted  # two slots taken
    running[1].release()
    assert small.is_admitted and admission.kv_bytes_running == 61 and not admission.queue


def test_a_full_queue_answers_busy_and_a_request_too_big_alone_is_refused_naming_its_bytes() -> None:
    admission, _ = _admission(running=1, queued=1, budget=100)
    admission.ticket(80)
    waiting = admission.ticket(30)
    with pytest.raises(RateLimited, match="1 are waiting") as busy:
        admission.ticket(1)
    assert busy.value.reason == "busy"
    with pytest.raises(PayloadTooLarge, match="KV budget") as refused:
        admission.ticket(101)
    assert refused.value.reason == "kv_budget_exceeded" and refused.value.details["kv_bytes"] == 101
    assert list(admission.queue) == [waiting] and len(admission.running) == 1  # nothing of them was kept
    waiting.release()  # a queued generation that ends (cancelled) leaves the queue
    assert not admission.queue and admission.kv_bytes_running == 80


def test_a_queued_generation_is_woken_when_it_is_admitted() -> None:
    async def scenario():
        admission, _ = _admission(running=1, queued=1, budget=100)
        first = admission.ticket(10)
        second = admission.ticket(10)
        waiter = asyncio.create_task(second.admitted())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        first.release()
        await asyncio.wait_for(waiter, 1)
        return second.is_admitted

    assert asyncio.run(scenario())


def test_a_queued_generation_takes_no_seat_in_the_batch_until_admitted_and_leaving_frees_everything() -> None:
    async def drive(model_id, gen, options, ctx, work):
        return [np.zeros((1, 4), dtype=np.float32)], [], 0.0

    class _Model:
        def run_batch(self, items, last_only):
            yield from ()
            return [np.zeros((1, 4), dtype=np.float32) for _ in items]

    async def scenario():
        admission, _ = _admission(running=1, queued=1, budget=100)
        batcher = StepBatcher(drive, lambda **kwargs: None, wait_s=5.0)
        model, options = _Model(), {"wire": None, "allow_partial": False}
        first = Place(batcher, admission.ticket(10), "m", model, options)
        second = Place(batcher, admission.ticket(10), "m", model, options)
        await first.step("m", model, np.array([1]), None, options, None, ForwardWork())
        waiting = asyncio.create_task(second.step("m", model, np.array([1]), None, options, None, ForwardWork()))
        await asyncio.sleep(0.01)
        seated_while_queued = batcher._batches[("m", id(model), None, False)].seated
        # the first's next step does not wait 5 s for a seat the queued one would hold
        started = asyncio.get_running_loop().time()
        await first.step("m", model, np.array([1]), None, options, None, ForwardWork())
        fast = asyncio.get_running_loop().time() - started < 1.0
        first.leave()
        await asyncio.wait_for(waiting, 1)
        second.leave()
        return seated_while_queued, fast, len(admission.running), len(admission.queue), batcher._batches

    seated, fast, running, queued, batches = asyncio.run(scenario())
    assert seated == 1 and fast and running == 0 and queued == 0 and batches == {}
