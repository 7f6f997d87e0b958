"""`manage.py expert_worker`: the expert worker process of a node.

It serves QUIC (ALPN tenzro/moe) on TENZRO_QUIC and answers this node's web process on
the Channels layer, both through the same WorkerMethods table. SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.management.base import BaseCommand

from apps.blobs.handlers import BlobHandlers
from apps.blobs.resolver import resolve_blob
from apps.blobs.selectors import blob_store
from apps.blobs.store import parse_blob_uri
from apps.experts.handlers import ExpertHandlers
from apps.experts.runtime import ExpertRuntime
from apps.node.selectors import node_identity
from apps.transport.bridge import WORKER_CHANNEL
from apps.transport.quic import HandlerError, QuicSettings, start_server
from apps.transport.worker_methods import WorkerMethods
from tenzro_site.settings.env import split_host_port

logger = logging.getLogger("tenzro.worker")


async def _answer_channel_call(layer: Any, methods: WorkerMethods, message: dict[str, Any]) -> None:
    reply = message.get("reply")
    if not isinstance(reply, str):
        return
    try:
        result, body = await methods(str(message.get("method")), message.get("params") or {}, message.get("body", b""))
        answer = {"type": "worker.reply", "ok": True, "result": result, "body": body}
    except HandlerError as exc:
        answer = {"type": "worker.reply", "ok": False, "reason": exc.reason, "message": exc.message}
    except Exception:
        logger.exception("worker method %s failed", message.get("method"))
        answer = {"type": "worker.reply", "ok": False, "reason": "internal_error", "message": "internal error"}
    await layer.send(reply, answer)


async def _channel_loop(methods: WorkerMethods, tasks: set[asyncio.Task]) -> None:
    layer = get_channel_layer()
    while True:
        message = await layer.receive(WORKER_CHANNEL)
        task = asyncio.create_task(_answer_channel_call(layer, methods, message))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def run_worker() -> None:
    identity = node_identity()
    budget = settings.TENZRO_MEMORY_BUDGET_BYTES or None  # 0: 60% of available memory
    runtime = ExpertRuntime(data_dir=settings.TENZRO_DATA_DIR, memory_budget_bytes=budget)
    executor = ThreadPoolExecutor(max_workers=settings.TENZRO_COMPUTE_THREADS, thread_name_prefix="expert")
    store = blob_store()

    def resolve(uri: str) -> bytes:
        return resolve_blob(store, parse_blob_uri(uri), peers=settings.TENZRO_PEERS,
                            max_bytes=settings.TENZRO_BLOB_MAX_BYTES)

    handlers = {
        **ExpertHandlers(runtime=runtime, executor=executor, resolve_blob=resolve).table(),
        **BlobHandlers(store=store, executor=executor).table(),
    }
    methods = WorkerMethods(identity=identity, extra=handlers)
    status = runtime.status()
    logger.info("expert runtime: %d experts (%d warm), %d gates, budget %d bytes, backend %s, kernel %s",
                len(status["experts"]), status["counts"]["warm"], status["counts"]["gates"],
                status["memory_budget_bytes"], status["backend"], status["cpu_kernel"])
    host, port = split_host_port(settings.TENZRO_QUIC, what="TENZRO_QUIC")
    server = await start_server(
        host=host, port=port, cert_path=str(identity.cert_path), key_path=str(identity.cert_key_path),
        handler=methods, settings=QuicSettings(max_body=settings.TENZRO_QUIC_MAX_BODY),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks: set[asyncio.Task] = set()
    channel_task = asyncio.create_task(_channel_loop(methods, tasks))
    logger.info("expert worker %s serving QUIC on %s:%s", identity.provider_id[:16], host, port)
    await stop.wait()
    logger.info("expert worker stopping")
    channel_task.cancel()
    server.close()
    for task in list(tasks):
        task.cancel()
    executor.shutdown(wait=False, cancel_futures=True)


class Command(BaseCommand):
    help = "Run this node's expert worker (QUIC endpoint + Channels-layer listener)."

    def handle(self, *args: Any, **options: Any) -> None:
        asyncio.run(run_worker())
