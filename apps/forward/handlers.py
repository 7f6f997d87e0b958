"""The expert worker's `moe/forward`: gate locally, read ahead, plan, dispatch, combine.

Runs in the expert worker (the data plane): hidden rows never pass through the database. The
gossiped view of the model's holders comes from the control plane through the worker's
ControlPlaneView (kept TENZRO_WORKER_CONTROL_TTL_S); this node's own holdings are taken live
from its runtime instead of from its last announcement, so a node that holds experts but is
not (yet) announced still serves them to itself. Failures become penalty rows and winners'
latencies feed the providers' measured latency, written after the answer, off the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
from django.conf import settings

from apps.forward import services
from apps.forward.callers import INLINE_ROWS, HolderCaller
from apps.forward.combine import ForwardIncomplete, StreamingCombine
from apps.forward.engine import ForwardLimits, run_forward
from apps.forward.hedging import HedgePolicy, LatencyBook
from apps.forward.ledger import ForwardWork
from apps.forward.report import ForwardReport
from apps.governance.selectors import policy_active
from apps.node.db_threads import with_kept_connections
from apps.providers.selectors import holding_views, provider_views, replication_policy
from apps.receipts.sampling import keep_receipt
from apps.worker.doors import CallContext, WorkerParts
from apps.worker.params import flag_param, fraction_param, hidden_param, str_param
from core import metrics
from core.errors import InvalidInput
from core.formats.wire import WIRE_CODECS, encoded_row_bytes, rows_to_bytes
from core.shardmap.gossip_view import HoldingView, ProviderView
from core.shardmap.index import ShardIndex
from core.shardmap.planner import plan_pairs
from core.transport.pool import QuicPool
from core.transport.quic import QuicSettings

logger = logging.getLogger("tenzro.forward")
COOLING_LATENCY_MS = 3_600_000.0  # ranks a cooling holder after every other (the planner adds latency)
Result = tuple[dict[str, Any], bytes]
View = tuple[list[ProviderView], list[HoldingView], Any, int]  # providers, holdings, policy, receipt 1-in-N


def distributed_forward(parts: WorkerParts) -> DistributedForward:
    """The worker's one DistributedForward: `moe/forward` and the whole-model methods that drive it
    layer by layer (apps/generation/handlers.py) share its QUIC pool, latency book and cooldowns."""
    forward = parts.shared.get("forward")
    if forward is None:
        forward = parts.shared["forward"] = DistributedForward(parts)
    return forward


def forward_handlers(parts: WorkerParts) -> dict[str, Any]:
    """moe/forward."""
    return {"moe/forward": distributed_forward(parts).forward}


class DistributedForward:
    def __init__(self, parts: WorkerParts) -> None:
        self.runtime = parts.runtime
        self.executor = parts.executor
        self.self_id = parts.provider_id
        self.control_plane = parts.control_plane
        self._sampling_key = parts.sampling_key
        self.book = LatencyBook(HedgePolicy(quantile=settings.TENZRO_FORWARD_HEDGE_QUANTILE,
                                            default_s=settings.TENZRO_FORWARD_HEDGE_DEFAULT_S or None,
                                            floor_s=settings.TENZRO_FORWARD_HEDGE_FLOOR_S))
        self.limits = ForwardLimits(max_in_flight=settings.TENZRO_FORWARD_MAX_IN_FLIGHT,
                                    max_replans=settings.TENZRO_FORWARD_MAX_REPLANS,
                                    attempt_timeout_s=settings.TENZRO_FORWARD_ATTEMPT_TIMEOUT_S)
        self._codec_executor = ThreadPoolExecutor(2, thread_name_prefix="codec")
        self._db = ThreadPoolExecutor(1, thread_name_prefix="forward-db")
        self._pool: QuicPool | None = None
        self._http: httpx.AsyncClient | None = None
        self._writes: set[asyncio.Future] = set()
        self._cooling: dict[str, float] = {}  # provider -> monotonic time its failure cooldown ends
        self._shards: dict[str, tuple[View, tuple[Any, ...], ShardIndex]] = {}  # model_id -> (view, key, index)
        self._prices_seen: tuple[View | None, dict[str, str]] = (None, {})  # (a view, its prices_of)

    def _quic_pool(self) -> QuicPool:
        if self._pool is None:  # created on the worker's loop, at the first forward
            self._pool = QuicPool(QuicSettings(max_body=settings.TENZRO_QUIC_MAX_BODY),
                                  idle_close_s=settings.TENZRO_FORWARD_IDLE_CLOSE_S)
        return self._pool

    def _http_client(self) -> httpx.AsyncClient:
        """The client for holders without a pinned QUIC door, made at the first such call: making one loads
        the certificate authorities, 74 ms of the first forward after a start on a 2-core VM (docs/performance.md,
        "A decode layer's steps, one holder at a time"), which a network of QUIC holders never needs."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=settings.TENZRO_FORWARD_ATTEMPT_TIMEOUT_S)
        return self._http

    async def _gossip_view(self, model_id: str) -> View:
        def read() -> View:
            return (provider_views(), holding_views(model_id), replication_policy(),
                    policy_active().receipt_sample_one_in)

        return await self.control_plane.read(f"forward.view:{model_id}", read)

    def _route(self, model_id: str, layer: int, hidden: np.ndarray, view: View) -> tuple[Any, ShardIndex]:
        """On the compute thread, in one hop: the gate's routing of `hidden`, readahead of the experts
        it chose that this node holds, and the shard index to plan on."""
        routing = self.runtime.route(model_id=model_id, layer=layer, hidden=hidden)
        self.runtime.readahead(self._chosen(model_id, layer, routing))
        return routing, self._shard(model_id, view)

    @staticmethod
    def _chosen(model_id: str, layer: int, routing: Any) -> list[tuple[str, int, int]]:
        return [(model_id, layer, int(e)) for e in np.unique(routing.experts)]

    def _shard(self, model_id: str, view: View) -> ShardIndex:
        """The shard index of `model_id`, built again only when its inputs changed: the gossip view (a
        new object each TENZRO_WORKER_CONTROL_TTL_S), this node's holdings, or who is cooling down.
        Planning a decode step then costs the plan itself, not a rebuild of every holder's rows."""
        key = self._shard_key()
        shard = self._cached_shard(model_id, view, key)
        if shard is None:
            shard = self._build_shard(model_id, view, key[1])
            self._shards[model_id] = (view, key, shard)
        return shard

    def prices_of(self, view: View) -> dict[str, str]:
        """{provider: its record's price per input token} in `view`, built once per view (a new object each
        TENZRO_WORKER_CONTROL_TTL_S): every layer's ledger reads it, and over a network of a thousand
        providers building it took ~47 µs a layer."""
        seen, prices = self._prices_seen
        if seen is not view:
            prices = {p.provider_id: p.price_per_input_token for p in view[0]}
            self._prices_seen = (view, prices)
        return prices

    def _shard_key(self) -> tuple[int, frozenset[str]]:
        now = time.monotonic()
        # list(): the loop thread updates _cooling while this may run on a compute thread
        cooling = frozenset(pid for pid, until in list(self._cooling.items()) if until > now)
        return self.runtime.holdings_version, cooling

    def _cached_shard(self, model_id: str, view: View, key: tuple[int, frozenset[str]]) -> ShardIndex | None:
        """The shard index built for `view` and `key` (_shard_key), None when it would be built again
        (which costs milliseconds)."""
        cached = self._shards.get(model_id)
        return cached[2] if cached is not None and cached[0] is view and cached[1] == key else None

    def _build_shard(self, model_id: str, view: View, cooling: frozenset[str]) -> ShardIndex:
        """The gossiped holders of other providers, and this node's live holdings (latency and wire time 0).

        This node's own experts count as Warm even when they sit in its disk tier: readahead has
        just promoted the ones the routing selected, and a local execute reads the disk tier itself
        (allow_cold is about asking a remote holder to do that)."""
        providers, holdings, policy, _ = view
        capacity, demand = self.runtime.capacity_tps(), self.runtime.demand_tps()
        me = ProviderView(self.self_id, tuple(settings.TENZRO_ROLES), None, None, None, False, 0.0,
                          wire_ns_per_byte=0.0)
        mine = [HoldingView(self.self_id, model_id, layer, expert, "Warm", demand.get((model_id, layer, expert), 0),
                            blob, capacity)
                for layer, expert, _, blob in self.runtime.held(model_id)]
        # A holder that failed or stalled lately is planned last (primary only when nobody else
        # holds the expert) until its cooldown ends: every forward need not pay its timeout again.
        others = [dataclasses.replace(p, latency_ms=COOLING_LATENCY_MS) if p.provider_id in cooling else p
                  for p in providers if p.provider_id != self.self_id]
        return ShardIndex.build(model_id, [*others, me],
                                [*(h for h in holdings if h.provider_id != self.self_id), *mine], policy)

    async def forward(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        model_id, layer = str_param(params, "model_id"), params.get("layer", 0)
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise InvalidInput(f"param 'layer' must be a non-negative integer, got {layer!r}")
        allow_partial, allow_cold = flag_param(params, "allow_partial"), flag_param(params, "allow_cold")
        min_gate_mass = fraction_param(params, "min_gate_mass")
        wire = params.get("wire")
        if wire is not None and wire not in WIRE_CODECS:
            raise InvalidInput(f"param 'wire' must be one of {list(WIRE_CODECS)}, got {wire!r}",
                               reason="unsupported_encoding")
        hidden = hidden_param(params, body)
        result, out = await self.forward_layer(model_id, layer, hidden, ctx, allow_partial=allow_partial,
                                               allow_cold=allow_cold, min_gate_mass=min_gate_mass,
                                               codecs=(wire,) if wire else ())
        return result, rows_to_bytes(out)

    async def forward_layer(self, model_id: str, layer: int, hidden: np.ndarray, ctx: CallContext, *,
                            allow_partial: bool = False, allow_cold: bool = False, min_gate_mass: float = 0.0,
                            codecs: tuple[str, ...] = (), keep_record: bool = True,
                            work: ForwardWork | None = None) -> tuple[dict[str, Any], np.ndarray]:
        """One layer's distributed forward of hidden f32 [tokens, d_model] (validated rows): the
        answer's JSON part (tokens, d_model, missing, lost_gate_mass, stats) and the combined
        rows f32 [tokens, d_model]. `codecs`: the wire codecs to offer, () for the node's own.
        Raises ForwardIncomplete (naming what is missing) when it fails closed. `keep_record`
        false: no ForwardRecord of its stats (a generation keeps them in its steps instead).
        `work`: a ledger to gather penalties, latencies, kept batches and settlement into (the
        caller writes it with record_work); without one they are written after this forward."""
        started = time.monotonic()
        codecs = codecs or tuple(c for c in settings.TENZRO_ACTIVATION_CODECS if c in WIRE_CODECS)
        gate = self.runtime.gate_spec(model_id, layer)
        view = await self._gossip_view(model_id)  # kept TENZRO_WORKER_CONTROL_TTL_S: no query per layer
        if len(hidden) <= INLINE_ROWS and (shard := self._cached_shard(model_id, view, self._shard_key())) is not None:
            # A decode step's gate over a few rows costs less than the hop to a compute thread and back;
            # loading a held expert from disk does not, so that readahead still goes to a thread.
            routing = ctx.run_inline(self.runtime.route, model_id=model_id, layer=layer, hidden=hidden)
            if self.runtime.needs_readahead(chosen := self._chosen(model_id, layer, routing)):
                await ctx.run_blocking(self.executor, self.runtime.readahead, chosen)
        else:
            routing, shard = await ctx.run_blocking(self.executor, self._route, model_id, layer, hidden, view)
        n_tokens, k = routing.experts.shape
        experts = routing.experts.ravel()
        planned_at = time.monotonic()

        # A row there and back in the first codec offered: what the planner weighs each holder's measured
        # wire time per byte by (a holder that takes only another codec is weighed as if it took this one).
        row_bytes = 2 * encoded_row_bytes(codecs[0] if codecs else "f32", gate.d_model)

        def plan(tokens: np.ndarray, layers: np.ndarray, exps: np.ndarray, exclude: frozenset[str]) -> Any:
            return plan_pairs(tokens, layers, exps, shard, allow_cold=allow_cold, exclude=exclude, row_bytes=row_bytes)

        async def run_local(layer_: int, expert: int, rows: np.ndarray) -> np.ndarray:
            return await ctx.run_blocking(self.executor, self.runtime.execute, model_id=model_id, layer=layer_,
                                          expert=expert, hidden=rows)

        caller = HolderCaller(self_id=self.self_id, model_id=model_id, d_model=gate.d_model, run_local=run_local,
                              pool=self._quic_pool(), http=self._http_client, codecs=codecs,
                              codec_executor=self._codec_executor, max_body=settings.TENZRO_PEER_MAX_BODY_BYTES,
                              timeout_s=self.limits.attempt_timeout_s, receipt_topk=settings.TENZRO_RECEIPT_TOPK,
                              keep_receipt=lambda h: keep_receipt(self._sampling_key, h, view[3]),
                              gather_batches=settings.TENZRO_EXECUTE_BATCHES)
        combine = StreamingCombine(n_tokens=n_tokens, d_model=gate.d_model, layer=layer,
                                   tokens=np.repeat(np.arange(n_tokens), k), experts=experts,
                                   weights=routing.weights.ravel(), n_routed=gate.n_routed)
        report = await run_forward(combine, hidden, np.full(len(experts), layer, np.int64), plan, caller, self.book,
                                   self.limits, fail_fast=not allow_partial or gate.n_routed == 0)
        forward_id = uuid.uuid4().hex
        # A dense layer's slices are summands of one output, not alternatives: without one of them
        # the row is wrong, not degraded, so a dense layer always fails closed.
        partial_ok = allow_partial and gate.n_routed > 0
        try:
            result = combine.finish(allow_partial=partial_ok, min_gate_mass=min_gate_mass)
        except ForwardIncomplete as exc:  # say why: which experts had no holder, which holders failed
            metrics.FORWARDS.labels("incomplete").inc()
            failed = _stats(report, np.zeros(0), elapsed_s=time.monotonic() - started,
                            dispatch_s=time.monotonic() - planned_at, codecs=codecs)
            self._record(model_id, report, view, forward_id, failed if keep_record else None, tokens=n_tokens,
                         missing=len(exc.details["missing"]) or 1, work=work)
            message = exc.message
            if report.unroutable:
                why = sorted({(layer_, e, reason) for _, layer_, e, reason in report.unroutable})
                named = "; ".join(f"layer {ly} expert {e}: {r}" for ly, e, r in why[:8])
                message += f" (no holder to plan on: {named}{' …' if len(why) > 8 else ''})"
            raise ForwardIncomplete(message, missing=exc.details["missing"], reason=exc.reason,
                                    failures=_failures(report)) from None
        finished = time.monotonic()
        stats = _stats(report, result.lost_share, elapsed_s=finished - started,
                       dispatch_s=finished - planned_at, codecs=codecs)
        for stage, seconds in (("plan", planned_at - started), ("dispatch", finished - planned_at),
                               ("total", finished - started)):
            metrics.FORWARD_SECONDS.labels(model_id, stage).observe(seconds)
        metrics.FORWARDS.labels("ok").inc()
        stats["forward_id"] = forward_id
        # Recorded once the stats exist (the finish above is synchronous: nothing awaits in between).
        self._record(model_id, report, view, forward_id, stats if keep_record else None, tokens=n_tokens,
                     missing=len(result.missing), work=work)
        return {"tokens": n_tokens, "d_model": gate.d_model, "missing": result.missing,
                "lost_gate_mass": [round(float(x), 6) for x in result.lost_share] if result.missing else [],
                "stats": stats}, result.out

    def _record(self, model_id: str, report: ForwardReport, view: View, forward_id: str,
                forward_stats: dict[str, Any] | None, *, tokens: int, missing: int,
                work: ForwardWork | None) -> None:
        """The cooldowns now; the forward's stats (unless None) after the answer; its penalties,
        latencies, kept batches and settlement into `work` (a generation's ledger, written when the
        generation ends) or, without one, to the control plane after the answer. Never on the way
        of the answer."""
        _count(report)
        until = time.monotonic() + settings.TENZRO_FORWARD_FAILURE_COOLDOWN_S
        cooling = report.cooling_providers()
        for pid in cooling:
            self._cooling[pid] = until
        for pid, stats in report.holders.items():
            if stats.batches and pid not in cooling:
                self._cooling.pop(pid, None)  # it answered this time
        if forward_stats is not None:
            self._write(lambda: services.forward_stats_record(forward_id=forward_id, model_id=model_id,
                                                              tokens=tokens, stats=forward_stats, missing=missing))
        holdings = view[1]
        own = work if work is not None else ForwardWork()
        kept = any(v.kept for s in report.holders.values() for v in s.receipts)
        own.add(report, self_id=self.self_id, prices=self.prices_of(view),
                blob_of={(h.provider_id, h.layer, h.expert): h.blob_uri for h in holdings} if kept else {})
        if work is None:
            self.record_work(model_id=model_id, forward_id=forward_id, work=own)

    def record_work(self, *, model_id: str, forward_id: str, work: ForwardWork) -> None:
        """Write a ledger on the database thread: penalties and latencies, the kept batches, and one
        settlement keyed by `forward_id` (a forward's id, or a generation's)."""
        if not work.failures and not work.holders:
            return

        def write() -> None:
            services.forward_outcome_record(model_id=model_id, failures=work.failures,
                                            latencies_ms=work.latency_medians(), self_id=self.self_id,
                                            wire_ns_per_byte=work.wire_medians())
            services.forward_work_record(forward_id=forward_id, router_id=self.self_id, model_id=model_id,
                                         kept=work.kept, holders=work.holder_rows())

        self._write(write)

    def _write(self, work: Callable[[], Any]) -> None:
        """Run `work` on the database thread, off the event loop; a failure is logged (_written)."""
        future = asyncio.get_running_loop().run_in_executor(self._db, with_kept_connections(work))
        self._writes.add(future)
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future) -> None:
        self._writes.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("could not record a forward's outcome: %s", future.exception())


# Failure reasons that mean a holder's receipt did not hold (docs/protocol.md, "Receipts").
_RECEIPT_REJECTIONS = frozenset({"bad_receipt", "receipt_missing"})


def _count(report: ForwardReport) -> None:
    """A forward's batches, failures and receipts in the node's metrics (a few increments per forward)."""
    for holder in report.holders.values():
        if holder.batches:
            metrics.FORWARD_BATCHES.labels(holder.transport or "local").inc(holder.batches)
        if len(holder.lanes) > 1:
            metrics.FORWARD_LANE_PARTS.inc(len(holder.lanes))
        if holder.receipts:
            metrics.RECEIPTS.labels("verified").inc(len(holder.receipts))
    for failure in report.failures:
        metrics.HOLDER_FAILURES.labels(metrics.reason_label(failure.reason)).inc()
        if failure.reason in _RECEIPT_REJECTIONS:
            metrics.RECEIPTS.labels("rejected").inc()


def _stats(report: ForwardReport, lost_share: np.ndarray, *, elapsed_s: float, dispatch_s: float,
           codecs: tuple[str, ...]) -> dict[str, Any]:
    holders = [s.to_dict() for s in sorted(report.holders.values(), key=lambda s: s.provider)]
    lost = float(lost_share.sum()) if lost_share.size else 0.0
    return {
        "elapsed_ms": round(elapsed_s * 1000.0, 3), "dispatch_ms": round(dispatch_s * 1000.0, 3),
        "batches": report.batches, "hedges_fired": report.hedges_fired, "hedges_won": report.hedges_won,
        "retries": report.retries, "replans": report.replans,
        "bytes_sent": sum(h["bytes_sent"] for h in holders),
        "bytes_received": sum(h["bytes_received"] for h in holders),
        "lost_gate_mass": round(lost, 6) if math.isfinite(lost) else None,
        "codecs": list(codecs), "holders": holders,
        "failures": _failures(report),
    }


def _failures(report: ForwardReport) -> list[dict[str, Any]]:
    return [{"provider": f.provider, "reason": f.reason, "layer": f.layer, "expert": f.expert, "rows": f.rows,
             "message": f.message[:300]} for f in report.failures]
