"""`manage.py expert_worker`: the expert worker process of a node (apps/worker/server.py)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.worker.server import WorkerServer
from core.loop_profile import LoopProfiler


async def run_worker() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if settings.TENZRO_PROFILE_DIR:  # docs/operations.md "Profiling a node"
        LoopProfiler(Path(settings.TENZRO_PROFILE_DIR)).install(loop)
    server = WorkerServer()
    await server.start()
    await stop.wait()
    await server.shutdown()


class Command(BaseCommand):
    help = "Run this node's expert worker (QUIC peer door + Channels-layer operator door)."

    def handle(self, *args: Any, **options: Any) -> None:
        asyncio.run(run_worker())
