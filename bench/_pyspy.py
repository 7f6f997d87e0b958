"""Profiles of a node's expert worker while a benchmark runs: py-spy samples it, this reads them.

py-spy (a requirements.txt tool) attaches to a running process by pid, so the node runs exactly as
it does unprofiled; `--nonblocking` keeps it from pausing the process at each sample. What is kept:
the raw folded stacks under bench/results/ (open them in speedscope or flamegraph.pl), and a
summary: per thread, the CPU seconds it used over the window (/proc, not samples); for the event
loop thread, the functions its busy samples were in (idle waits in the selector left out).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

IDLE = ("select (selectors.py", "_worker (concurrent/futures/thread.py:81)", "Condition.wait", "wait (threading.py")
_PATH = re.compile(r"\((?:/[^()]*?/site-packages/|/[^()]*?/python3\.\d+/|/[^()]*?/(?=apps/|core/|cli/))")


def available() -> str | None:
    """py-spy's path (beside this interpreter, as `make install` puts it, else on PATH), or None."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Profile:
    """py-spy recording `pid` to `out` (folded stacks) for `seconds`, with per-thread CPU around it."""

    def __init__(self, pid: int, out: Path, seconds: float, rate: int = 100) -> None:
        self.pid, self.out = pid, out
        self._process = psutil.Process(pid)
        self._cpu_before = self._thread_cpu()
        self._spy = subprocess.Popen([available() or "py-spy", "record", "-p", str(pid), "--format", "raw",
                                      "-o", str(out), "-r", str(rate), "--nonblocking", "--threads",
                                      "-d", str(int(seconds))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _thread_cpu(self) -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in self._process.threads()}

    def finish(self, *, steps: int, top: int = 12) -> dict[str, Any]:
        """Stop sampling; per-thread CPU ms per step (`steps` of the work measured) and the event
        loop's busy frames as shares of its busy samples."""
        cpu_after = self._thread_cpu()
        self._spy.wait()
        names: dict[int, str] = {}
        busy: Counter[str] = Counter()
        for line in self.out.read_text().splitlines() if self.out.exists() else []:
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            match = re.match(r"thread \((\d+)\): (.+)", frames[0])
            if match:
                names[int(match.group(1))] = match.group(2)
            if "MainThread" in frames[0] and len(frames) > 1 and not any(i in frames[-1] for i in IDLE):
                busy[_PATH.sub("(", frames[-1])] += int(count)
        threads = sorted(((cpu_after[t] - self._cpu_before.get(t, 0.0), names.get(t, f"native {t}"))
                          for t in cpu_after), reverse=True)
        total = sum(busy.values()) or 1
        return {"cpu_ms_per_step": {name: round(s * 1000.0 / max(steps, 1), 3) for s, name in threads[:8] if s > 0},
                "event_loop_busy": [(frame, round(n / total, 4)) for frame, n in busy.most_common(top)],
                "raw": str(self.out)}
