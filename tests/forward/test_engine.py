"""Failover, hedging and replanning of the dispatch, with holders that fail or hang on purpose."""

import asyncio
import time

import numpy as np
import pytest

from apps.forward.combine import ForwardIncomplete, StreamingCombine
from apps.forward.engine import ForwardLimits, run_forward
from apps.forward.hedging import HedgePolicy, LatencyBook
from apps.forward.report import Answer
from core.errors import Unavailable
from core.shardmap.index import ShardIndex
from core.shardmap.planner import plan_pairs
from testkit.shard_views import MODEL, POLICY, holding, provider, provider_id

D = 4
N_EXPERTS = 4


class Holders:
    """Holder n answers expert e with rows * (e + 1), unless told to fail or hang."""

    def __init__(self, behaviour: dict[int, str] | None = None, delay_s: float = 0.0) -> None:
        self.behaviour = {provider_id(n): b for n, b in (behaviour or {}).items()}
        self.delay_s = delay_s
        self.calls: list[tuple[str, int]] = []
        self.cancelled: list[str] = []

    async def __call__(self, holder, layer, expert, rows, tokens):
        pid = holder.provider_id
        self.calls.append((pid, expert))
        what = self.behaviour.get(pid, "ok")
        if what == "fail":
            raise Unavailable(f"{pid[-2:]} is down", reason="connection_failed")
        try:
            if what == "hang":
                await asyncio.sleep(3600)
            if what == "block":  # holds the event loop (as a late wake-up would), then answers at once
                time.sleep(0.1)
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled.append(pid)
            raise
        return Answer(rows * np.float32(expert + 1), bytes_sent=rows.nbytes, bytes_received=rows.nbytes,
                      transport="quic")


def _shard(holders_of: dict[int, list[int]]) -> ShardIndex:
    ns = sorted({n for ns in holders_of.values() for n in ns})
    holdings = [holding(n, 0, e, tps=1000 - n) for e, ns in holders_of.items() for n in ns]
    return ShardIndex.build(MODEL, [provider(n) for n in ns], holdings, POLICY)


def _forward(shard, holders, *, tokens=40, k=2, book=None, limits=None, allow_partial=False):
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((tokens, D)).astype(np.float32)
    experts = np.stack([rng.permutation(N_EXPERTS)[:k] for _ in range(tokens)])
    weights = np.full((tokens, k), 1.0 / k, np.float32)
    tok = np.repeat(np.arange(tokens), k)
    combine = StreamingCombine(n_tokens=tokens, d_model=D, layer=0, tokens=tok, experts=experts.ravel(),
                               weights=weights.ravel(), n_routed=N_EXPERTS)
    layers = np.zeros(len(tok), np.int64)

    def plan(t, layer, e, exclude):
        return plan_pairs(t, layer, e, shard, exclude=exclude, min_batch_rows=1 << 20)

    async def forward():
        report = await run_forward(combine, hidden, layers, plan, holders, book or LatencyBook(),
                                   limits or ForwardLimits(attempt_timeout_s=5))
        for _ in range(5):  # a cancel reaches the attempts in the next turns of the loop
            await asyncio.sleep(0)
        holders.cancelled_by_the_end = list(holders.cancelled)  # before asyncio.run cancels what is left
        return report

    report = asyncio.run(forward())
    expected = (hidden[:, None, :] * (experts[:, :, None] + 1) * weights[:, :, None]).sum(axis=1)
    return combine, report, expected, experts


def test_every_batch_served_once_and_combined(kind):
    holders = kind()()
    combine, report, expected, _ = _forward(_shard({e: [1, 2] for e in range(N_EXPERTS)}), holders)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    assert report.failures == [] and report.hedges_fired == 0 and report.replans == 0
    assert len(holders.calls) == report.batches == N_EXPERTS


def test_a_failed_primary_falls_over_to_its_backup_and_is_excluded_afterwards(kind):
    holders = kind()({1: "fail"})
    combine, report, expected, _ = _forward(_shard({e: [1, 2] for e in range(N_EXPERTS)}), holders)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    assert {f.provider for f in report.failures} == {provider_id(1)}
    assert all(f.reason == "connection_failed" for f in report.failures)
    assert report.retries == len(report.failures) >= 1
    assert report.holders[provider_id(2)].batches == N_EXPERTS


def test_a_batch_walks_every_listed_holder_before_giving_up(kind):
    holders = kind()({1: "fail", 2: "fail"})
    shard = _shard({0: [1, 2, 3], 1: [3], 2: [3], 3: [3]})
    combine, report, expected, _ = _forward(shard, holders)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    assert {f.provider for f in report.failures} == {provider_id(1), provider_id(2)}
    assert report.replans == 0  # expert 0's backups (2, then 3) were enough


def test_bounded_replanning_then_fail_closed_or_partial(kind):
    holders = kind()({1: "fail", 2: "fail"})
    shard = _shard({0: [1, 2], 1: [3], 2: [3], 3: [3]})
    combine, report, _, experts = _forward(shard, holders, limits=ForwardLimits(max_replans=2))
    assert report.replans == 1  # the replan found no holder left for expert 0, so no third wave
    with pytest.raises(ForwardIncomplete) as caught:
        combine.finish(allow_partial=False)
    assert {m["expert"] for m in caught.value.details["missing"]} == {0}
    partial = combine.finish(allow_partial=True)
    assert len(partial.missing) == int((experts == 0).sum())


def test_a_hanging_primary_is_raced_out_by_its_backup_and_cancelled(kind):
    holders = kind()({1: "hang"})
    book = LatencyBook(HedgePolicy(default_s=0.05, floor_s=0.001))
    combine, report, expected, _ = _forward(_shard({e: [1, 2] for e in range(N_EXPERTS)}), holders, book=book)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    primaries = sum(1 for pid, _ in holders.calls if pid == provider_id(1))
    assert report.hedges_fired == report.hedges_won == primaries >= 1
    assert holders.cancelled_by_the_end == [provider_id(1)] * primaries  # the losers' attempts were cancelled
    assert {f.reason for f in report.failures} == {"stalled"}
    assert report.failed_providers == frozenset()  # slow is not dead: not excluded


@pytest.mark.parametrize("answering", [True, False])
def test_a_raced_out_primary_still_answering_gives_its_book_a_sample_and_is_not_cooled(kind, answering):
    """Slow, not hung (its connection still answers): one sample of the time it had taken per forward, so
    its quantile follows its path; silent, it is cooled down and its book left alone."""
    holders = kind()({1: "hang"})
    holders.heard_since = lambda holder, since: answering
    book = LatencyBook(HedgePolicy(default_s=0.05, floor_s=0.001))
    _, report, _, _ = _forward(_shard({e: [1, 2] for e in range(N_EXPERTS)}), holders, book=book)
    assert report.hedges_fired >= 1 and {f.reason for f in report.failures} == {"stalled"}
    assert {f.answering for f in report.failures} == {answering}
    samples = [s for (pid, _), q in book._samples.items() if pid == provider_id(1) for s in q]
    assert (len(samples), report.cooling_providers()) == ((1, frozenset()) if answering else
                                                          (0, frozenset({provider_id(1)})))
    assert not answering or samples[0] >= 0.05  # at least the hedge delay it ran past


def test_a_fast_primary_is_not_hedged_once_its_p95_is_known():
    holders = Holders(delay_s=0.05)
    book = LatencyBook(HedgePolicy(default_s=0.001, floor_s=0.0001, min_samples=2))
    shard = _shard({e: [1, 2] for e in range(N_EXPERTS)})
    _, first, _, _ = _forward(shard, holders, book=book)
    assert first.hedges_fired > 0  # the default delay (1 ms) is shorter than these 50 ms batches
    _forward(shard, holders, book=book)  # min_samples: two of each (holder, batch size)
    # Batches well inside the known p95 (a margin a loaded test machine's scheduling does not eat,
    # where batches exactly as long as the p95 were hedged whenever one ran a little late).
    holders.delay_s = 0.005
    for _ in range(3):
        _, later, _, _ = _forward(shard, holders, book=book)
        assert later.hedges_fired <= 1  # with the default's 1 ms, every batch would be


def test_a_primary_done_in_the_same_wake_up_as_its_backup_wins_and_is_measured():
    # The backup (2) is raced in after 1 ms and holds the loop past the primary's (1) 50 ms: when the race
    # looks again both are done. The primary started first, so it wins, and its latency is the one recorded.
    holders = Holders({2: "block"}, delay_s=0.05)
    book = LatencyBook(HedgePolicy(default_s=0.001, floor_s=0.0001, min_samples=1))
    holdings = [holding(n, 0, e, tps=tps) for e in range(N_EXPERTS) for n, tps in ((1, 1000), (2, 1))]
    shard = ShardIndex.build(MODEL, [provider(1), provider(2)], holdings, POLICY)  # 1 the primary of every batch
    combine, report, expected, _ = _forward(shard, holders, book=book)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    assert report.hedges_fired == N_EXPERTS and report.hedges_won == 0
    assert report.holders[provider_id(1)].batches == N_EXPERTS and provider_id(2) not in report.holders
    assert book.median_s(provider_id(1)) is not None and book.median_s(provider_id(2)) is None


def test_fail_fast_dispatches_nothing_when_a_pair_has_no_holder_at_all():
    holders = Holders()
    shard = _shard({0: [1], 1: [1], 2: [2]})  # nobody holds expert 3

    def run(fail_fast):
        rng = np.random.default_rng(0)
        hidden = rng.standard_normal((8, D)).astype(np.float32)
        tok = np.repeat(np.arange(8), 2)
        experts = np.tile([0, 3], 8)
        combine = StreamingCombine(n_tokens=8, d_model=D, layer=0, tokens=tok, experts=experts,
                                   weights=np.full(16, 0.5, np.float32), n_routed=N_EXPERTS)
        plan = lambda t, layer, e, exclude: plan_pairs(t, layer, e, shard, exclude=exclude)  # noqa: E731
        return asyncio.run(run_forward(combine, hidden, np.zeros(16, np.int64), plan, holders, LatencyBook(),
                                       ForwardLimits(), fail_fast=fail_fast)), combine

    report, combine = run(True)
    assert holders.calls == [] and {u[3] for u in report.unroutable} == {"no_holder"}
    assert len(combine.unserved()) == 16
    report, combine = run(False)
    assert holders.calls == [(provider_id(1), 0)] and len(combine.unserved()) == 8


def test_a_busy_holder_is_asked_again_without_a_penalty(kind):
    class Busy(Holders):
        async def __call__(self, holder, layer, expert, rows, tokens):
            if holder.provider_id == provider_id(1) and sum(pid == provider_id(1) for pid, _ in self.calls) < 2:
                self.calls.append((holder.provider_id, expert))
                raise Unavailable("slow down", reason="rate_limited")
            return await super().__call__(holder, layer, expert, rows, tokens)

    holders = kind(Busy)()
    combine, report, expected, _ = _forward(_shard({0: [1], 1: [1], 2: [1], 3: [1]}), holders)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    assert report.failures == [] and report.retries == 0  # pushed back twice, served by the same holder


class Gathering:
    """Mixin: each holder takes a wave's batches as one request (as HolderCaller does for a holder that
    advertises execute_batches), which fails, hangs or is cancelled as a whole; its answers share one
    request id."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, list[int]]] = []  # (holder, experts) of each request

    def gathers(self, holder) -> bool:
        return True

    async def __call__(self, holder, layer, expert, rows, tokens):
        answer = await super().__call__(holder, layer, expert, rows, tokens)
        return Answer(answer.rows, transport="quic", request=hash(holder.provider_id) & 0xFFFF)

    async def many(self, holder, layer, calls, lane=0):
        self.requests.append((holder.provider_id, [expert for expert, _, _ in calls]))
        parts = [asyncio.ensure_future(self(holder, layer, *call)) for call in calls]
        try:
            return list(await asyncio.gather(*parts))
        finally:
            for part in parts:  # one request: when it fails or is cancelled, none of it goes on
                part.cancel()


class GatheringHolders(Gathering, Holders):
    pass


@pytest.fixture(params=["a request per batch", "a request per holder"])
def kind(request):
    """Holders called batch by batch, or (a decode step's common case) one request per holder."""
    gathered = request.param == "a request per holder"
    return lambda cls=Holders: type(f"Gathering{cls.__name__}", (Gathering, cls), {}) if gathered else cls


def test_a_gathered_request_is_one_latency_sample_sized_by_its_rows() -> None:
    """The batches of one gathered request end together: counting each as a sample would fill the
    holder's quantile with copies of one request, and hedge every batch of the next slower one."""
    book = LatencyBook(HedgePolicy(min_samples=2))
    shard = _shard({e: [0] for e in range(N_EXPERTS)})
    _, report, _, _ = _forward(shard, GatheringHolders(), tokens=40, k=2, book=book)
    assert report.batches == N_EXPERTS and not report.failures
    samples = {key: list(q) for key, q in book._samples.items()}
    assert list(samples) == [(provider_id(0), 7)]  # one holder, keyed by the request's 80 rows (bucket 7)
    assert len(samples[(provider_id(0), 7)]) == 1


def test_a_gathered_request_is_one_wire_share_its_time_less_the_compute_of_all_its_batches() -> None:
    """Each batch's own time less its own compute would count its siblings' compute as the wire's."""
    class Computing(GatheringHolders):
        async def __call__(self, holder, layer, expert, rows, tokens):
            answer = await super().__call__(holder, layer, expert, rows, tokens)
            return Answer(answer.rows, transport="quic", request=answer.request, compute_s=0.010)

    shard = _shard({e: [0] for e in range(N_EXPERTS)})
    _, report, _, _ = _forward(shard, Computing(delay_s=0.05), tokens=40, k=2)
    stats = report.holders[provider_id(0)]
    assert stats.batches == N_EXPERTS and len(stats.overheads_s) == 1
    assert stats.overheads_s[0] == pytest.approx(stats.latencies_s[0] - N_EXPERTS * 0.010)


def test_a_lone_request_runs_on_the_forwards_own_task() -> None:
    """A layer whose batches all go to one holder is one request: awaited by the forward itself, without a
    task of its own (and the loop turns it costs to start and to end); several requests still run side by side."""
    class Tasks(GatheringHolders):
        async def many(self, holder, layer, calls, lane=0):
            self.tasks.append(asyncio.current_task())
            return await super().many(holder, layer, calls, lane)

    hidden = np.random.default_rng(0).standard_normal((2, D)).astype(np.float32)
    experts = np.array([[0, 1], [2, 3]])  # token 0 to experts 0 and 1, token 1 to 2 and 3, weights 0.5

    async def run(shard):
        holders = Tasks()
        holders.tasks = []
        combine = StreamingCombine(n_tokens=2, d_model=D, layer=0, tokens=np.repeat(np.arange(2), 2),
                                   experts=experts.ravel(), weights=np.full(4, 0.5, np.float32), n_routed=N_EXPERTS)
        await run_forward(combine, hidden, np.zeros(4, np.int64),
                          lambda t, ly, e, ex: plan_pairs(t, ly, e, shard, exclude=ex), holders, LatencyBook(),
                          ForwardLimits(attempt_timeout_s=5))
        return holders, asyncio.current_task(), combine.finish(allow_partial=False).out

    holders, outer, out = asyncio.run(run(_shard({e: [1] for e in range(N_EXPERTS)})))
    assert len(holders.requests) == 1 and holders.tasks == [outer]
    np.testing.assert_allclose(out, hidden * np.array([[1.5], [3.5]], np.float32), rtol=1e-6)  # 0.5 (e + 1) each
    holders, outer, out = asyncio.run(run(_shard({0: [1], 1: [1], 2: [2], 3: [2]})))
    assert len(holders.requests) == 2 and outer not in holders.tasks
    np.testing.assert_allclose(out, hidden * np.array([[1.5], [3.5]], np.float32), rtol=1e-6)


class LaningHolders(GatheringHolders):
    """Each holder offers `offered` connection lanes for a request of at least `from_rows` rows (as
    HolderCaller does over a lossy path); `failing_lane` fails every request sent on it."""

    def __init__(self, *args, offered=(0, 2, 5), from_rows=1, failing_lane=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.offered, self.from_rows, self.failing_lane = list(offered), from_rows, failing_lane
        self.sent: list[tuple[str, int, list[int], list[int]]] = []  # (holder, lane, experts, tokens)
        self.pairs: list[tuple[int, int, int]] = []  # (lane, expert, token) of every pair sent

    def lanes(self, holder, rows):
        if rows >= self.from_rows and holder.provider_id == provider_id(0):
            return [(lane, 30_000) for lane in self.offered]
        return [(0, 0)]

    async def many(self, holder, layer, calls, lane=0):
        self.sent.append((holder.provider_id, lane, [e for e, _, _ in calls],
                          sorted({int(t) for _, _, tokens in calls for t in tokens})))
        self.pairs += [(lane, int(e), int(t)) for e, _, tokens in calls for t in tokens]
        if lane == self.failing_lane:
            raise Unavailable(f"lane {lane} lost", reason="connection_closed")
        return await super().many(holder, layer, calls, lane)


def test_a_request_split_over_lanes_serves_each_pair_on_one_lane_and_combines_exactly() -> None:
    holders = LaningHolders()
    combine, report, expected, experts = _forward(_shard({e: [0] for e in range(N_EXPERTS)}), holders,
                                                  tokens=40, k=2)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    assert not report.failures
    assert sorted(lane for _, lane, _, _ in holders.sent) == [0, 2, 5]  # the lanes offered, each once
    assert report.holders[provider_id(0)].to_dict()["lanes"] == 3  # the forward's stats say so
    routed = sorted((int(e), t) for t in range(40) for e in experts[t])
    assert sorted((e, t) for _, e, t in holders.pairs) == routed  # each (expert, token) pair on one lane, once
    per_lane = [sum(1 for lane, *_ in holders.pairs if lane == offered) for offered in (0, 2, 5)]
    assert max(per_lane) - min(per_lane) <= 1  # even
    # cut in expert order: each expert's weights are read once, plus once per cut
    assert sum(len(asked) for _, _, asked, _ in holders.sent) <= len(set(np.ravel(experts).tolist())) + 2


def test_small_requests_stay_whole_on_the_first_lane() -> None:
    holders = LaningHolders(from_rows=1000)
    combine, _, expected, _ = _forward(_shard({e: [0] for e in range(N_EXPERTS)}), holders, tokens=40, k=2)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    assert [(lane, len(tokens)) for _, lane, _, tokens in holders.sent] == [(0, 40)]


def test_a_failed_lane_fails_over_only_its_own_batches() -> None:
    holders = LaningHolders(failing_lane=2)
    shard = _shard({e: [0, 1] for e in range(N_EXPERTS)})  # each expert's backup on the other holder
    combine, report, expected, _ = _forward(shard, holders, tokens=40, k=2)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    laned = [(lane, asked, tokens) for pid, lane, asked, tokens in holders.sent if pid == provider_id(0)]
    assert sorted(lane for lane, _, _ in laned) == [0, 2, 5]  # no lane asked twice
    _, asked, _ = next(x for x in laned if x[0] == 2)
    assert {f.provider for f in report.failures} == {provider_id(0)}
    assert {f.expert for f in report.failures} <= set(asked)
    # the failures are the lost lane's pairs, no more
    assert sum(f.rows for f in report.failures) == sum(1 for lane, *_ in holders.pairs if lane == 2)
