"""Dispatch of a planned layer forward: per-holder batches, failover, hedging, replanning.

Pure module (no Django, no aioquic): the caller injects how a batch is executed on a holder
(`BatchExecutor`: locally, over QUIC or over HTTP; apps/forward/callers.py) and how pairs are
planned (`Planner`: core.shardmap.planner over the gossiped view), so the whole failover
logic runs in unit tests with holders that fail, hang or answer late on purpose.

    run_forward(combine, hidden, plan, execute, book, limits) -> ForwardReport

* Every batch of the plan runs concurrently, at most `limits.max_in_flight` at a time (batches for a
  holder the executor `gathers` into one multi-expert request are not counted: they start together
  and cost one request); each result goes into the StreamingCombine the moment it arrives.
* The batches of a holder that `gathers` go out as one request (`execute.many`) and are served by
  one attempt while it goes well: one task and one timer per holder, not per batch. When that
  request fails, each of its batches fails over on its own; when it stalls, each races its backup
  against it, and it is cancelled once no batch waits for it. A request larger than its connection's
  congestion window on a lossy path goes as several, cut in expert order, one per connection lane
  the executor offers (`execute.lanes`, apps/forward/lanes.py), each served as such a request.
* A batch walks its holders warm-first (the primary, then the plan's ordered backups). A
  primary that stalls — slower than its own p95 for batches of that size (hedging.py) — is
  raced by the next holder; the first answer wins and the other attempt is cancelled (its
  QUIC stream is reset, so the holder stops). A holder that errs or times out is a failure:
  the next holder is tried (a retry), and the holder is excluded for the rest of this forward.
* When every holder of a batch failed, its pairs stay unserved; once the wave is over they
  are replanned against the view without every provider that failed so far (results already
  combined stay), at most `limits.max_replans` times.
* Each failure (and each raced-out stall) is reported for a penalty; each winner's latency
  feeds the LatencyBook (hedge delays) and the report (the planner's ranking). A raced-out primary
  whose connection still answered was slow, not hung: its time so far goes into its book too (once
  per forward), and it is not cooled down (ForwardReport.cooling_providers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from apps.forward.combine import StreamingCombine
from apps.forward.hedging import LatencyBook
from apps.forward.lanes import split_in_expert_order
from apps.forward.report import Answer, Failure, ForwardReport
from core.errors import TenzroError
from core.shardmap.gossip_view import ProviderView
from core.shardmap.planner import Batch, DispatchPlan


class BatchExecutor(Protocol):
    async def __call__(self, holder: ProviderView, layer: int, expert: int, rows: np.ndarray,
                       tokens: np.ndarray) -> Answer:
        """Run rows f32 [n, d_model] (the forward's tokens int64 [n]) through (layer, expert) on
        `holder`; raise TenzroError on failure (a bad or missing receipt included)."""
        ...

    def gathers(self, holder: ProviderView) -> bool:
        """True when the batches started together for `holder` travel as one request (a multi-expert
        moe/execute): they need no in-flight slot each, since they cost one request per holder."""
        ...

    async def many(self, holder: ProviderView, layer: int, calls: list[tuple[int, np.ndarray, np.ndarray]],
                   lane: int = 0) -> list[Answer]:
        """One request to a holder that `gathers`: each (expert, rows, tokens) of `layer`, answered in
        order, on the transport's `lane`th connection to it; raise TenzroError when the request fails
        (every batch in it fails with it)."""
        ...

    def lanes(self, holder: ProviderView, rows: int) -> list[tuple[int, int]]:
        """Optional. The lanes a request of `rows` rows to `holder` may be split over now (the
        transport's connections to it, core/transport/lanes.py), each with its window in bytes (0:
        unknown); [(0, 0)]: keep it whole."""
        ...

    def heard_since(self, holder: ProviderView, since: float) -> bool | None:
        """Optional. Whether anything came back from `holder` at or after `since` (time.monotonic());
        None: the transport cannot tell."""
        ...


# A holder shedding load answers these: it is healthy, so it is asked again after a pause instead
# of being failed, penalized and cooled down.
BACKPRESSURE = frozenset({"rate_limited", "too_many_streams"})

# (tokens, layers, experts, exclude) -> plan; pairs as in core.shardmap.planner.plan_pairs
Planner = Callable[[np.ndarray, np.ndarray, np.ndarray, frozenset[str]], DispatchPlan]


@dataclass(frozen=True)
class ForwardLimits:
    max_in_flight: int = 16
    max_replans: int = 2
    attempt_timeout_s: float = 30.0
    max_hedges_per_batch: int = 1
    backpressure_retries: int = 3  # a holder that said "not now" (rate_limited, too_many_streams) is asked again
    backpressure_wait_s: float = 0.05


async def run_forward(
    combine: StreamingCombine,
    hidden: np.ndarray,
    layers: np.ndarray,
    plan: Planner,
    execute: BatchExecutor,
    book: LatencyBook,
    limits: ForwardLimits,
    *,
    fail_fast: bool = False,
) -> ForwardReport:
    """Serve every pair of `combine` that can be served; hidden f32 [tokens, d_model],
    layers int64 [n_pairs] (the layer of each pair). Never raises for holder failures: the
    pairs left unserved are the combine's to judge (fail closed or partial).

    `fail_fast`: when the first plan already leaves pairs without any holder (the forward will
    fail closed whatever happens), dispatch nothing."""
    report = ForwardReport()
    in_flight = asyncio.Semaphore(limits.max_in_flight)
    for wave in range(limits.max_replans + 1):
        todo = combine.unserved()
        if not len(todo):
            break
        if wave:
            report.replans += 1
        planned = plan(combine.tokens[todo], layers[todo], combine.experts[todo], report.failed_providers)
        if wave == 0:  # what no holder can serve at all; later waves only re-report it
            report.unroutable = list(planned.unroutable)
            if fail_fast and report.unroutable:
                break
        routed = planned.pair_batch >= 0
        if not routed.any():
            break
        order = np.argsort(planned.pair_batch, kind="stable")  # stable: tokens stay ascending per batch
        order = order[routed[order]]
        sorted_batch = planned.pair_batch[order]
        starts = [0, *(np.flatnonzero(sorted_batch[1:] != sorted_batch[:-1]) + 1).tolist()]
        ordered = todo[order]
        groups = [ordered[a:b] for a, b in zip(starts, [*starts[1:], len(ordered)], strict=True)]  # views
        failures_before = len(report.failures)
        report.batches += len(groups)
        batch_of = sorted_batch.tolist()
        batches = [planned.batches[batch_of[s]] for s in starts]
        gathers = getattr(execute, "gathers", None)
        # A holder that takes a wave's batches as one request answers them all after the request's
        # time: its latency book is kept, and its hedges timed, by the rows of the whole request.
        request_rows: dict[str, int] = {}
        requests: dict[tuple[str, int], list[tuple[Batch, np.ndarray]]] = {}
        singles: list[tuple[Batch, np.ndarray]] = []
        for batch, pairs in zip(batches, groups, strict=True):
            pid = batch.provider.provider_id
            request_rows[pid] = request_rows.get(pid, 0) + len(pairs)
            if gathers is not None and gathers(batch.provider):
                requests.setdefault((pid, batch.layer), []).append((batch, pairs))
            else:
                singles.append((batch, pairs))
        serving = [
            *(_serve_request(part, combine, hidden, execute, book, limits, report, in_flight, size=size, lane=lane)
              for (pid, _), items in requests.items()
              for lane, part, size in _lanes(items, request_rows[pid], execute)),
            *(_serve_batch(batch, pairs, combine, hidden, execute, book, limits, report, in_flight,
                           gathered=False, size=len(pairs)) for batch, pairs in singles)]
        if len(serving) == 1:  # one request: awaited here, without gather's task and the loop turns it costs
            await serving[0]
        else:
            await asyncio.gather(*serving)
        if len(report.failures) == failures_before:
            break  # nothing failed: what is left is unroutable, and replanning cannot change that
    return report


def _lanes(items: list[tuple[Batch, np.ndarray]], size: int, execute: BatchExecutor
           ) -> list[tuple[int, list[tuple[Batch, np.ndarray]], int]]:
    """[(lane, items, rows)]: a holder's request of `size` rows, cut in expert order over the lanes its
    executor offers for that size (apps/forward/lanes.py), or whole on lane 0."""
    offered = getattr(execute, "lanes", None)
    lanes = offered(items[0][0].provider, size) if offered is not None else [(0, 0)]
    if len(lanes) <= 1:
        return [(0, items, size)]
    parts = split_in_expert_order(items, [window for _, window in lanes])
    return [(lane, part, sum(len(pairs) for _, pairs in part))
            for (lane, _), part in zip(lanes, parts, strict=False)]


async def _serve_request(items: list[tuple[Batch, np.ndarray]], combine: StreamingCombine, hidden: np.ndarray,
                         execute: BatchExecutor, book: LatencyBook, limits: ForwardLimits, report: ForwardReport,
                         in_flight: asyncio.Semaphore, *, size: int, lane: int = 0) -> None:
    """The batches `items` of one layer whose primary takes them as one request of `size` rows: one
    attempt for all of them while it goes well (a decode step's common case: one timer per holder, not per
    batch, and a task of its own only where a hedge could race it). When the request fails, each batch
    fails over on its own; when it stalls past the holder's hedge delay, each batch races its backup
    against it (_race), and the request is cancelled once no batch waits for it."""
    holder, layer = items[0][0].provider, items[0][0].layer
    calls = []
    for batch, pairs in items:
        tokens = combine.tokens[pairs]
        calls.append((batch.expert, np.ascontiguousarray(hidden[tokens]), tokens))
    hedgeable = limits.max_hedges_per_batch > 0 and any(batch.backups for batch, _ in items)
    pushed_back = 0
    while True:
        started = time.monotonic()
        attempt = _attempt_many(execute, holder, layer, calls, limits.attempt_timeout_s, lane)
        after = book.hedge_after_s(holder.provider_id, size) if hedgeable else None
        try:
            if after is None:  # nothing to race it against: awaited here, without a task and a wait of its own
                answers = await attempt
            else:
                shared = asyncio.ensure_future(attempt)
                try:
                    done, _ = await asyncio.wait((shared,), timeout=after)
                except asyncio.CancelledError:
                    shared.cancel()
                    raise
                answers = shared.result() if done else None
        except (TenzroError, TimeoutError, OSError) as exc:
            reason = _reason(exc)
            if await _backed_off(reason, pushed_back + 1, limits):
                pushed_back += 1  # the same request again, no penalty
                continue
            stats = report.holder(holder.provider_id)
            for batch, pairs in items:  # one failure per batch, as if each had been asked alone
                stats.failures += 1
                report.failures.append(Failure(holder.provider_id, reason, str(exc) or reason, layer, batch.expert,
                                               len(pairs)))
            await asyncio.gather(*(_serve_batch(batch, pairs, combine, hidden, execute, book, limits, report,
                                                in_flight, gathered=True, size=size, failed_here=1)
                                   for batch, pairs in items))
            return
        if answers is None:  # stalled: every batch races its backup against the request still running
            await _race_stalled(items, calls, shared, started, combine, execute, book, limits, report, size)
            return
        elapsed = time.monotonic() - started
        book.record(holder.provider_id, size, elapsed)
        stats = report.holder(holder.provider_id)
        stats.lanes.add(lane)
        for (_, pairs), answer in zip(items, answers, strict=True):
            stats.credit(answer, len(pairs), elapsed, overhead=False)
            combine.add(pairs, answer.rows)
        computes = [answer.compute_s for answer in answers]
        if None not in computes:  # one request, one wire's share: its time less the compute of all its batches
            stats.overheads_s.append(max(0.0, elapsed - sum(computes)))  # type: ignore[arg-type]
        return


async def _attempt_many(execute: BatchExecutor, holder: ProviderView, layer: int,
                        calls: list[tuple[int, np.ndarray, np.ndarray]], timeout_s: float, lane: int) -> list[Answer]:
    async with asyncio.timeout(timeout_s):
        answers = await execute.many(holder, layer, calls, lane)
    if len(answers) != len(calls):
        raise TenzroError(f"{len(answers)} answers to a request of {len(calls)} batches", reason="bad_answer")
    return answers


async def _race_stalled(items: list[tuple[Batch, np.ndarray]], calls: list[tuple[int, np.ndarray, np.ndarray]],
                        shared: asyncio.Future[list[Answer]], started: float, combine: StreamingCombine,
                        execute: BatchExecutor, book: LatencyBook, limits: ForwardLimits, report: ForwardReport,
                        size: int) -> None:
    """Each batch of a stalled request in its own race, the request's answer for it as its primary."""
    loop = asyncio.get_running_loop()
    parts: list[asyncio.Future[Answer]] = [loop.create_future() for _ in items]

    def fan_out(request: asyncio.Future[list[Answer]]) -> None:
        for i, part in enumerate(parts):
            if part.done():
                continue
            if request.cancelled():
                part.cancel()
            elif request.exception() is not None:
                part.set_exception(request.exception())  # type: ignore[arg-type]
            else:
                part.set_result(request.result()[i])

    def left(_: asyncio.Future[Answer]) -> None:  # answered, failed or raced out: nobody else waits for it
        if all(part.done() for part in parts) and not shared.done():
            shared.cancel()  # its stream is reset, the holder stops

    shared.add_done_callback(fan_out)
    for part in parts:
        part.add_done_callback(left)

    async def one(i: int) -> None:
        (batch, pairs), (_, rows, tokens) = items[i], calls[i]
        won = await _race(batch, rows, tokens, execute, book, limits, report, size, primary=(parts[i], started))
        if won is not None:
            combine.add(pairs, won.rows)

    try:
        await asyncio.gather(*(one(i) for i in range(len(items))))
    finally:
        shared.cancel()


def _raced_out(stalled: ProviderView, since: float, winner: ProviderView, batch: Batch, n: int, size: int,
               execute: BatchExecutor, book: LatencyBook, report: ForwardReport) -> None:
    """`stalled`'s attempt (running since `since`, a request of `size` rows) lost the race to `winner`'s.

    Still answering (datagrams came back since its request went out), it is slow, not hung: its book
    gets one sample (per forward) of the time it has taken so far, a lower bound of its latency.
    Without it, its book would hold its wins only and, after its path's round trip jumped, keep the old
    path's quantile and race out every request."""
    heard = getattr(execute, "heard_since", None)
    answering = bool(heard(stalled, since)) if heard is not None else False
    now = time.monotonic()
    why = "still answering" if answering else "nothing back since its request"
    report.failures.append(Failure(stalled.provider_id, "stalled",
                                   f"raced out after {now - since:.3f} s by {winner.provider_id} ({why})",
                                   batch.layer, batch.expert, n, answering=answering))
    if answering and stalled.provider_id not in report.censored:
        report.censored.add(stalled.provider_id)
        book.record(stalled.provider_id, size, now - since)


def _reason(exc: BaseException) -> str:
    """A failed attempt's reason: the error's own, `timeout`, or `connection_failed` for a socket error."""
    return "timeout" if isinstance(exc, TimeoutError) else getattr(exc, "reason", "connection_failed")


async def _backed_off(reason: str, times: int, limits: ForwardLimits) -> bool:
    """Whether a holder that failed with `reason` is asked again, after a pause: a holder shedding load
    is healthy but busy, so it is asked up to `limits.backpressure_retries` times (this the `times`-th)."""
    if reason not in BACKPRESSURE or times > limits.backpressure_retries:
        return False
    await asyncio.sleep(limits.backpressure_wait_s * times)
    return True


async def _serve_batch(batch: Batch, pairs: np.ndarray, combine: StreamingCombine, hidden: np.ndarray,
                       execute: BatchExecutor, book: LatencyBook, limits: ForwardLimits, report: ForwardReport,
                       in_flight: asyncio.Semaphore, *, gathered: bool, size: int, failed_here: int = 0) -> None:
    """`gathered`: the primary takes this wave's batches as one request of `size` rows. `failed_here`:
    holders that already failed this batch (its request), so the next one asked is a retry."""
    tokens = combine.tokens[pairs]
    rows = np.ascontiguousarray(hidden[tokens])
    if gathered:  # all start now: one request
        won = await _race(batch, rows, tokens, execute, book, limits, report, size, failed_here=failed_here)
    else:
        async with in_flight:
            won = await _race(batch, rows, tokens, execute, book, limits, report, len(rows))
    if won is not None:
        combine.add(pairs, won.rows)


async def _race(batch: Batch, rows: np.ndarray, tokens: np.ndarray, execute: BatchExecutor, book: LatencyBook,
                limits: ForwardLimits, report: ForwardReport, primary_size: int, *, failed_here: int = 0,
                primary: tuple[asyncio.Future[Answer], float] | None = None) -> Answer | None:
    """The batch's holders in order, the next one raced against a stalled one; the winner's answer.
    `primary_size`: the rows of the primary's request (the latency book's size for it; a backup's
    request is this batch's rows as far as the engine knows). `primary`: the primary's attempt, already
    running since the given time (a stalled shared request's part for this batch)."""
    running: dict[asyncio.Future[Answer], tuple[ProviderView, float]] = {}
    if primary is not None:
        running[primary[0]] = (batch.provider, primary[1])
    waiting = [h for h in (batch.provider, *batch.backups)
               if h.provider_id not in report.failed_providers and (primary is None or h is not batch.provider)]
    n = len(rows)
    hedges = pushed_back = 0
    stalled: ProviderView | None = None
    stalled_since = 0.0

    async def attempt(holder: ProviderView) -> Answer:
        async with asyncio.timeout(limits.attempt_timeout_s):
            return await execute(holder, batch.layer, batch.expert, rows, tokens)

    def start(holder: ProviderView) -> None:
        running[asyncio.ensure_future(attempt(holder))] = (holder, time.monotonic())

    try:
        while running or waiting:
            if not running:
                report.retries += failed_here > 0  # a holder failed this batch: the next one is a retry
                start(waiting.pop(0))
            newest_holder, newest_start = list(running.values())[-1]
            hedge_at = None
            if waiting and hedges < limits.max_hedges_per_batch:
                size = primary_size if newest_holder is batch.provider else n
                after = book.hedge_after_s(newest_holder.provider_id, size)
                hedge_at = None if after is None else newest_start + after
            timeout = None if hedge_at is None else max(0.0, hedge_at - time.monotonic())
            done, _ = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # the newest attempt stalled past its p95: race the next holder
                hedges += 1
                report.hedges_fired += 1
                stalled, stalled_since = newest_holder, newest_start
                start(waiting.pop(0))
                continue
            # In the order they started: when the loop woke late and several attempts are done at
            # once, the earliest (the primary) wins and is measured, as it would have been on time.
            for task in [t for t in running if t in done]:
                holder, started = running.pop(task)
                stats = report.holder(holder.provider_id)
                try:
                    answer = task.result()
                except (TenzroError, TimeoutError, OSError) as exc:
                    reason = _reason(exc)
                    if await _backed_off(reason, pushed_back + 1, limits):
                        pushed_back += 1  # the same holder again, no penalty
                        waiting.insert(0, holder)
                        continue
                    stats.failures += 1
                    failed_here += 1
                    report.failures.append(Failure(holder.provider_id, reason, str(exc) or reason, batch.layer,
                                                   batch.expert, n))
                    continue
                elapsed = time.monotonic() - started
                # A gathered request's batches all end at its time: one sample per request, or its
                # quantile would be drawn from copies of itself and hedge the next one that runs longer.
                if answer.request is None or answer.request not in report.timed_requests:
                    book.record(holder.provider_id, primary_size if holder is batch.provider else n, elapsed)
                    if answer.request is not None:
                        report.timed_requests.add(answer.request)
                stats.credit(answer, n, elapsed)
                if stalled is not None and holder is not stalled:
                    report.hedges_won += 1
                    if any(h is stalled for h, _ in running.values()):
                        _raced_out(stalled, stalled_since, holder, batch, n,
                                   primary_size if stalled is batch.provider else n, execute, book, report)
                return answer
        return None
    finally:
        for task in running:
            task.cancel()  # a raced-out attempt: its stream is reset, the holder stops
