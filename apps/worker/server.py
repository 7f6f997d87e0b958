"""The expert worker process: the runtime, its two doors, and its publisher to the control plane.

`WorkerServer` has the lifecycle every long-lived service here has: `start()` builds the
runtime and opens both doors, `ready` is set once they serve, `shutdown()` closes them and
records the stop. The peer door is the QUIC endpoint (core/transport/quic.py); the operator
door is the Redis mailbox WORKER_CALLS that this node's web process posts calls to
(apps/worker/client.py, apps/worker/mailbox.py). Both dispatch through one MethodTable, which checks the door of each
method (apps/worker/doors.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.blobs.handlers import BlobHandlers
from apps.blobs.peers import blob_holders
from apps.blobs.quic_fetch import QuicBlobSource
from apps.blobs.resolver import HttpBlobSource, resolve_blob
from apps.blobs.selectors import blob_store
from apps.blobs.store import parse_blob_uri
from apps.node.db_threads import with_connections_closed_after, with_kept_connections
from apps.node.selectors import node_identity
from apps.receipts.commitment import ReceiptSigner
from apps.receipts.sampling import sampling_key
from apps.receipts.verify_method import VerifyMethod
from apps.worker import mailbox, services
from apps.worker.client import WORKER_CALLS
from apps.worker.control_plane import ControlPlaneView
from apps.worker.doors import CallContext, Door, MethodTable, WorkerParts, contributed_handlers
from apps.worker.expert_methods import ExpertHandlers, Payload
from apps.worker.peer_limits import peer_limits
from apps.worker.publisher import StatePublisher
from apps.worker.warmup import warm_kernels
from core import metrics
from core.env import split_host_port
from core.experts.gpu.backend import GpuBackend
from core.experts.host_share import HostShare, check_explicit_budget
from core.experts.runtime import ExpertRuntime
from core.experts.selection import choose_backend
from core.transport.framing import Reply
from core.transport.quic import PeerRequest, QuicSettings, start_server

logger = logging.getLogger("tenzro.worker")
# The operator door's retry delay while Redis does not answer: first, then doubling up to the cap.
OPERATOR_DOOR_RETRY_S = (0.2, 2.0)


def _tier_gauges(status: dict[str, Any]) -> dict[str, Any]:
    """Set tenzro_tier_bytes from a status the publisher takes anyway (on every change and heartbeat)."""
    experts = status.get("experts", [])
    warm = sum(e["memory_bytes"] for e in experts)
    metrics.TIER_BYTES.labels("warm").set(warm)
    metrics.TIER_BYTES.labels("cold").set(sum(e["disk_bytes"] for e in experts if e["residency"] == "Cold"))
    # memory_used_bytes is the memory tier plus the reservations (dense weights) under the same budget
    metrics.TIER_BYTES.labels("reserved").set(max(0, status.get("memory_used_bytes", 0) - warm))
    metrics.TIER_BYTES.labels("budget").set(status.get("memory_budget_bytes", 0))
    return status


class _CountedSigner:
    """The signer, counting each receipt it signs (tenzro_receipts_total{event="signed"}): one per
    answer, a multi-expert one included."""

    def __init__(self, signer: ReceiptSigner) -> None:
        self._signer = signer

    def __call__(self, **kwargs: Any) -> dict[str, Any]:
        receipt = self._signer(**kwargs)
        metrics.RECEIPTS.labels("signed").inc()
        return receipt

    def batches(self, **kwargs: Any) -> dict[str, Any]:
        receipt = self._signer.batches(**kwargs)
        metrics.RECEIPTS.labels("signed").inc()
        return receipt


class WorkerServer:
    def __init__(self) -> None:
        self.identity = node_identity()
        self.ready = asyncio.Event()
        self._started_mono = time.monotonic()
        self._started_at = timezone.now()
        self._tasks: set[asyncio.Task] = set()
        self._quic: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start(): QUIC blob fetches run on it
        # What this worker cannot reach right now ("redis": the operator door's mailboxes); moe/status shows it.
        self.degraded: set[str] = set()
        self.executor = ThreadPoolExecutor(max_workers=settings.TENZRO_COMPUTE_THREADS, thread_name_prefix="expert")
        self.publisher = StatePublisher(
            snapshot=lambda: _tier_gauges(self.runtime.status()),
            publish=with_kept_connections(lambda status: services.worker_state_publish(
                provider_id=self.identity.provider_id, pid=os.getpid(), started_at=self._started_at, status=status)),
            heartbeat=with_kept_connections(
                lambda status: services.worker_state_heartbeat(pid=os.getpid(), status=status)),
            heartbeat_s=settings.TENZRO_WORKER_HEARTBEAT_S,
        )
        budget, self.host_share = self._memory_budget()
        # a forced GPU backend that cannot run stops the worker here, with the reason (BackendUnavailable)
        self.compute = choose_backend(choice=settings.TENZRO_EXPERT_BACKEND,
                                      device_budget_bytes=settings.TENZRO_GPU_MEMORY_BUDGET_BYTES or None,
                                      device_index=settings.TENZRO_GPU_DEVICE)
        logger.info("%s", self.compute.summary())
        self.runtime = ExpertRuntime(data_dir=settings.TENZRO_DATA_DIR, memory_budget_bytes=budget,
                                     backend=self.compute.backend, backend_candidates=self.compute.candidates,
                                     on_change=self.publisher.changed, on_corrupt=self._on_corrupt,
                                     meter_window_s=settings.TENZRO_METER_WINDOW_S)
        self.control_plane = ControlPlaneView(executor=ThreadPoolExecutor(1, thread_name_prefix="control"),
                                              ttl_s=settings.TENZRO_WORKER_CONTROL_TTL_S)
        store = blob_store()

        def resolve(uri: str) -> Payload:
            """Runs on a compute thread: the store, then peers that announce the blob, then a few other
            providers of the gossip view (QUIC pinned to their records; then their HTTP doors), then the
            configured peers over HTTP (apps/providers/selectors.blob_holder_endpoints)."""
            hash_ = parse_blob_uri(uri)
            sources = with_connections_closed_after(self._blob_sources)(hash_)  # a compute thread's one read
            resolved = resolve_blob(store, hash_, sources=sources, max_bytes=settings.TENZRO_BLOB_MAX_BYTES)
            if resolved.source is not None:
                self.methods.counts[f"blob_fetch.{resolved.source.split()[0]}"] += 1
                logger.info("blob %s fetched over %s", hash_[:16], resolved.source)
            return Payload(resolved.data, stored_at=store.path(hash_))

        self._resolve = resolve
        self.parts = WorkerParts(self.runtime, self.executor, self.identity.provider_id, self.control_plane,
                                 sampling_key(bytes(self.identity.signing_key)))
        experts = ExpertHandlers(runtime=self.runtime, executor=self.executor, resolve_blob=resolve,
                                 max_payload_bytes=settings.TENZRO_BLOB_MAX_BYTES, after_change=self.publisher.flush,
                                 sign_receipt=_CountedSigner(ReceiptSigner(self.identity.signing_key))
                                 if settings.TENZRO_SIGN_RECEIPTS else None,
                                 receipt_topk=settings.TENZRO_RECEIPT_TOPK,
                                 max_answer_bytes=settings.TENZRO_PEER_MAX_BODY_BYTES,
                                 accept_batches=settings.TENZRO_EXECUTE_BATCHES,
                                 inline_rows=settings.TENZRO_INLINE_COMPUTE_ROWS)
        self.methods = MethodTable({
            **experts.table(),
            **BlobHandlers(store=store, executor=self.executor).table(),
            **VerifyMethod(runtime=self.runtime, executor=self.executor, signing_key=self.identity.signing_key,
                           compute_tolerance=settings.TENZRO_DISPUTE_COMPUTE_TOLERANCE,
                           max_rows=settings.TENZRO_VERIFY_MAX_ROWS,
                           rate_per_min=settings.TENZRO_VERIFY_RATE_PER_MIN).table(),
            **contributed_handlers(self.parts),
            "moe/status": self.moe_status,
        })

    def _blob_sources(self, hash_: str) -> list[Any]:
        holders = blob_holders(hash_)
        sources: list[Any] = [QuicBlobSource(h.quic_endpoint, h.quic_cert_sha256, self._loop) for h in holders
                              if h.quic_endpoint and h.quic_cert_sha256 and self._loop is not None]
        urls = dict.fromkeys([*(h.http_endpoint for h in holders if h.http_endpoint), *settings.TENZRO_PEERS])
        return sources + [HttpBlobSource(url) for url in urls]

    # -- a corrupt disk-tier payload ----------------------------------------------------------

    def _on_corrupt(self, key: tuple[str, int, int], blob_uri: str | None) -> None:
        """From a compute thread: the runtime forgot an expert whose disk-tier payload failed its
        hash. One that came from a blob is fetched again (the store's copy is checked too, and
        replaced from a peer when it is the corrupt one) and reloaded, in the background."""
        self.methods.counts["disk_tier.corrupt"] += 1
        loop = self._loop
        if blob_uri is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: self._spawn(self._refetch(key, blob_uri)))

    async def _refetch(self, key: tuple[str, int, int], uri: str) -> None:
        assert self._loop is not None
        model_id, layer, expert = key
        try:
            payload = await self._loop.run_in_executor(self.executor, self._resolve, uri)
            await self._loop.run_in_executor(self.executor, functools.partial(
                self.runtime.expert_load, payload=payload.data, blob_uri=uri, stored_at=payload.stored_at,
                expect={"model_id": model_id, "layer": layer, "expert": expert}))
        except Exception as exc:
            self.methods.counts["disk_tier.refetch_failed"] += 1
            logger.error("expert %s/%d/%d stays forgotten: its blob %s could not be fetched again (%s)",
                         model_id, layer, expert, uri, exc)
            return
        self.methods.counts["disk_tier.refetched"] += 1
        logger.info("expert %s/%d/%d reloaded from a fresh copy of %s", model_id, layer, expert, uri)
        await self.publisher.flush()

    # -- methods of the worker itself -----------------------------------------------------------

    async def moe_status(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> tuple[dict, bytes]:
        return {
            "provider_id": self.identity.provider_id,
            "quic_cert_sha256": self.identity.cert_sha256,
            "roles": list(settings.TENZRO_ROLES),
            "version": settings.TENZRO_VERSION,
            "uptime_s": round(time.monotonic() - self._started_mono, 3),
            "pid": os.getpid(),
            "calls": dict(sorted(self.methods.counts.items())),
            "degraded": sorted(self.degraded),
        }, b""

    # -- the doors ------------------------------------------------------------------------------

    async def peer_door(self, request: PeerRequest) -> Reply:
        return await self.methods.call(request.method, request.params, request.body,
                                       CallContext(Door.PEER, peer=request.peer))

    async def _operator_call(self, message: dict[str, Any]) -> None:
        reply_to = message.get("reply")
        if not isinstance(reply_to, str):
            return
        deadline = message.get("deadline")
        door = Door.PEER if message.get("door") == "peer" else Door.OPERATOR  # HTTP fallback of the peer door
        peer = message.get("peer") if door is Door.PEER and isinstance(message.get("peer"), str) else None
        ctx = CallContext(door, peer=(peer, 0) if peer else None,
                          deadline=float(deadline) if isinstance(deadline, int | float) else None)
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        call = self.methods.call(str(message.get("method")), params, message.get("body") or b"", ctx)
        try:
            if ctx.deadline is None:
                reply = await call
            else:  # at the caller's deadline stop waiting; a job not yet started is cancelled with us
                async with asyncio.timeout(max(0.0, ctx.deadline - time.time())):
                    reply = await call
        except TimeoutError:
            # The caller has given up and answered its client already. A job still queued was
            # withdrawn (counted as dropped_past_deadline); one already computing finishes unseen.
            self.methods.counts["operator.abandoned_past_deadline"] += 1
            return
        header = reply.header
        if header["ok"]:
            answer = {"ok": True, "result": header["result"], "body": bytes(reply.body)}
        else:
            answer = {"ok": False, **header["error"]}
        try:
            await mailbox.post(reply_to, answer)
        except Exception as exc:  # Redis went away mid-call: the caller times out with worker_unavailable
            self.methods.counts["operator.reply_lost"] += 1
            logger.warning("could not send the answer to %s: %s: %s", message.get("method"), type(exc).__name__, exc)

    async def _operator_door(self) -> None:
        """Serve the WORKER_CALLS mailbox for as long as the worker runs, Redis outages included.

        The mailbox lives in Redis: while Redis is down or restarting, taking raises.
        The door then reports `redis` degraded (moe/status, over QUIC too) and retries with a
        capped backoff instead of ending, so the node recovers by itself once Redis is back."""
        backoff_s = OPERATOR_DOOR_RETRY_S[0]
        while True:
            try:
                message = await mailbox.take(WORKER_CALLS, mailbox.TAKE_POLL_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # redis-py raises several kinds; all mean "not now"
                if "redis" not in self.degraded:
                    logger.warning("the operator door cannot read its Redis mailbox (%s: %s); retrying until "
                                   "Redis answers", type(exc).__name__, exc)
                    self.methods.counts["operator_door.redis_outages"] += 1
                self.degraded.add("redis")
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, OPERATOR_DOOR_RETRY_S[1])
                continue
            if "redis" in self.degraded:
                self.degraded.discard("redis")
                logger.info("the operator door reads its Redis mailbox again")
            backoff_s = OPERATOR_DOOR_RETRY_S[0]
            if message is not None:
                self._spawn(self._operator_call(message))

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- lifecycle -------------------------------------------------------------------------------

    @staticmethod
    def _memory_budget() -> tuple[int, HostShare | None]:
        """The chosen budget (refused above the host's memory), or this node's share of the host's."""
        chosen = settings.TENZRO_MEMORY_BUDGET_BYTES
        if chosen:
            check_explicit_budget(chosen)
            logger.info("memory budget %.2f GiB (TENZRO_MEMORY_BUDGET_BYTES)", chosen / 2**30)
            return chosen, None
        share = HostShare.join(settings.TENZRO_DATA_DIR)
        budget, line = share.budget()
        logger.info("%s", line)
        return budget, share

    async def _follow_host_share(self) -> None:
        """A default budget follows the nodes that join and leave this host (core/experts/host_share.py)."""
        assert self.host_share is not None
        while True:
            await asyncio.sleep(settings.TENZRO_WORKER_HEARTBEAT_S)
            budget, line = self.host_share.budget()
            if budget != self.runtime.memory_budget_bytes:
                logger.info("%s", line)
                self.runtime.set_memory_budget(budget)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.host_share is not None:
            self._spawn(self._follow_host_share())
        status = self.runtime.status()
        logger.info("expert runtime: %d experts (%d warm), %d gates, budget %d bytes, backend %s, kernel %s",
                    len(status["experts"]), status["counts"]["warm"], status["counts"]["gates"],
                    status["memory_budget_bytes"], status["backend"], status["cpu_kernel"])
        self._spawn(self.publisher.run())
        await self.publisher.flush(timeout_s=30.0)  # readers see this run's holdings from the start
        started = time.monotonic()  # compile the kernels before the doors open (apps/worker/warmup.py)
        seconds = await self._loop.run_in_executor(self.executor, functools.partial(
            warm_kernels, self.runtime.backend, receipt_topk=settings.TENZRO_RECEIPT_TOPK))
        logger.info("kernels warm in %.2f s (%s)", time.monotonic() - started,
                    ", ".join(f"{path} {s:.2f}" for path, s in seconds.items()))
        host, port = split_host_port(settings.TENZRO_QUIC, what="TENZRO_QUIC")
        self._quic = await start_server(
            host=host, port=port, cert_path=str(self.identity.cert_path), key_path=str(self.identity.cert_key_path),
            handler=self.peer_door, settings=QuicSettings(max_body=settings.TENZRO_PEER_MAX_BODY_BYTES),
            limits=peer_limits(),
        )
        self._spawn(self._operator_door())
        self._spawn(self._warm_held())
        for hook in self.parts.on_start:  # what other parts restore once the doors are open (a router's dense parts)
            self._spawn(hook())
        self.ready.set()
        logger.info("expert worker %s serving QUIC on %s:%s", self.identity.provider_id[:16], host, port)

    async def _warm_held(self) -> None:
        """Bring the experts this node held before its restart back into memory (within the budget),
        on one compute thread while the doors are open: each one promoted is announced Warm, and
        only Warm holders are planned on while others hold the expert (core/experts/tiered_cache.py)."""
        started = time.monotonic()
        promoted = await asyncio.get_running_loop().run_in_executor(self.executor, self.runtime.warm)
        if promoted:
            logger.info("%d experts promoted from the disk tier in %.2f s", promoted, time.monotonic() - started)

    async def shutdown(self) -> None:
        logger.info("expert worker stopping")
        if self._quic is not None:
            # the answers in flight go out first (their routers would count each cut one a failure);
            # new requests are told shutting_down, and their routers ask another holder
            unfinished = await self._quic.drain(settings.TENZRO_WORKER_DRAIN_S)
            if unfinished:
                logger.warning("%d answers still unfinished after %.0f s of drain: cut", unfinished,
                               settings.TENZRO_WORKER_DRAIN_S)
            self._quic.close()
        for task in list(self._tasks):
            task.cancel()
        await self.publisher.close(final=with_kept_connections(lambda: services.worker_state_stopped(pid=os.getpid())))
        if self.host_share is not None:
            self.host_share.leave()
        self.executor.shutdown(wait=False, cancel_futures=True)
        if isinstance(self.runtime.backend, GpuBackend):
            self.runtime.backend.close()  # hands the device memory back before the process exits
