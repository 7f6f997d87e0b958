"""`manage.py expert_worker`: the expert worker process of a node (apps/worker/server.py)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from django.core.management.base import BaseCommand

from apps.worker.server import WorkerServer


async def run_worker() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = WorkerServer()
    await server.start()
    await stop.wait()
    await server.shutdown()


class Command(BaseCommand):
    help = "Run this node's expert worker (QUIC peer door + Channels-layer operator door)."

    def handle(self, *args: Any, **options: Any) -> None:
        asyncio.run(run_worker())
