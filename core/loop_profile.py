"""cProfile of an event loop's thread, switched on and off by a signal while the process runs.

py-spy samples a process from outside, but where ptrace or /proc/<pid>/mem is closed to it (some
containers and sandboxes) it cannot attach. This is the fallback from inside: SIGUSR1 starts a
cProfile of the thread that runs the loop (the signal's handler runs on that thread), the next
SIGUSR1 stops it and writes the stats, one file per window, to `out_dir` (read them with
`python -m pstats FILE`). Only the loop's thread is profiled: compute threads show as the time the
loop spent handing work over, not as their own work (their CPU is in /proc/<pid>/task).
"""

from __future__ import annotations

import asyncio
import cProfile
import logging
import os
import signal
import time
from pathlib import Path

logger = logging.getLogger(__name__)


class LoopProfiler:
    """Toggle a cProfile of the running loop's thread with SIGUSR1; each window goes to `out_dir`."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._profile: cProfile.Profile | None = None
        self._started = 0.0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        loop.add_signal_handler(signal.SIGUSR1, self.toggle)
        logger.info("event loop profiler armed: SIGUSR1 to %d starts and stops it, stats to %s", os.getpid(),
                    self.out_dir)

    def toggle(self) -> Path | None:
        """Start a window, or end the running one; the stats file of a window that ended."""
        if self._profile is None:
            self._profile, self._started = cProfile.Profile(), time.monotonic()
            self._profile.enable()
            return None
        profile, self._profile = self._profile, None
        profile.disable()
        out = self.out_dir / f"loop-{os.getpid()}-{int(time.time() * 1000)}.pstats"
        partial = out.with_suffix(".partial")
        profile.dump_stats(partial)
        partial.replace(out)  # whole or not there: a reader polls for the name
        logger.info("event loop profile of %.1f s written to %s", time.monotonic() - self._started, out)
        return out
