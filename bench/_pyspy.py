"""Profiles of a node's expert worker while a benchmark runs: py-spy samples it, this reads them.

py-spy (a requirements.txt tool) attaches to a running process by pid, so the node runs exactly as
it does unprofiled; `--nonblocking` keeps it from pausing the process at each sample. What is kept:
the raw folded stacks under bench/results/ (open them in speedscope or flamegraph.pl), and a
summary: per thread, the CPU seconds it used over the window (/proc, not samples); for the event
loop thread, the functions its busy samples were in (idle waits in the selector left out).

Where py-spy cannot attach (ptrace or /proc/<pid>/mem closed to it, as in some containers), the
worker profiles its own event loop (core/loop_profile.py: the node started with TENZRO_PROFILE_DIR,
a window between two SIGUSR1): the loop's functions by their own time (cProfile's tottime), the
.pstats file kept instead of the folded stacks.
"""

from __future__ import annotations

import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import time
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


def attaches(pid: int) -> bool:
    """Whether py-spy is here and can read `pid` (a one-off dump)."""
    spy = available()
    return bool(spy) and subprocess.run([spy, "dump", "--nonblocking", "-p", str(pid)], capture_output=True,
                                        timeout=30).returncode == 0


def loop_profile_dir() -> Path | None:
    """Where nodes started by this process write their event-loop profiles (core/loop_profile.py), if set."""
    value = os.environ.get("TENZRO_PROFILE_DIR", "")
    return Path(value) if value else None


class Profile:
    """py-spy recording `pid` to `out` (folded stacks) for `seconds`, with per-thread CPU around it; where
    py-spy cannot attach, the worker's own event-loop profile (module docstring)."""

    def __init__(self, pid: int, out: Path, seconds: float, rate: int = 100) -> None:
        self.pid, self.out = pid, out
        self._process = psutil.Process(pid)
        self._loop_dir = None if attaches(pid) else loop_profile_dir()
        self._cpu_before = self._thread_cpu()
        self._spy: subprocess.Popen | None = None
        if self._loop_dir is not None:
            self._windows_before = set(self._loop_dir.glob(f"loop-{pid}-*.pstats"))
            os.kill(pid, signal.SIGUSR1)
            return
        if not available():
            return
        self._spy = subprocess.Popen([available() or "py-spy", "record", "-p", str(pid), "--format", "raw",
                                      "-o", str(out), "-r", str(rate), "--nonblocking", "--threads",
                                      "-d", str(int(seconds))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _thread_cpu(self) -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in self._process.threads()}

    def finish(self, *, steps: int, top: int = 12) -> dict[str, Any]:
        """Stop sampling; per-thread CPU ms per step (`steps` of the work measured) and the event
        loop's busy frames as shares of its busy samples."""
        cpu_after = self._thread_cpu()
        names: dict[int, str] = {}
        busy: Counter[str] = Counter()
        if self._loop_dir is not None:
            busy, raw = self._loop_window()
        elif self._spy is not None:
            self._spy.wait()
            raw = str(self.out) if self.out.exists() else "py-spy could not attach, and TENZRO_PROFILE_DIR is not set"
        else:
            raw = "no py-spy, and TENZRO_PROFILE_DIR is not set"
        for line in self.out.read_text().splitlines() if self._spy is not None and self.out.exists() else []:
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            match = re.match(r"thread \((\d+)\): (.+)", frames[0])
            if match:
                names[int(match.group(1))] = match.group(2)
            if "MainThread" in frames[0] and len(frames) > 1 and not any(i in frames[-1] for i in IDLE):
                busy[_PATH.sub("(", frames[-1])] += int(count)
        threads = sorted(((cpu_after[t] - self._cpu_before.get(t, 0.0), names.get(t) or self._thread_name(t))
                          for t in cpu_after), reverse=True)
        total = sum(busy.values()) or 1
        return {"cpu_ms_per_step": {name: round(s * 1000.0 / max(steps, 1), 3) for s, name in threads[:8] if s > 0},
                "event_loop_busy": [(frame, round(n / total, 4)) for frame, n in busy.most_common(top)],
                "raw": raw}

    def _thread_name(self, tid: int) -> str:
        try:
            comm = Path(f"/proc/{self.pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            comm = ""
        return f"{'main thread (event loop)' if tid == self.pid else comm or 'native'} {tid}"

    def _loop_window(self) -> tuple[Counter[str], str]:
        """End the worker's loop profile window; its functions by own time, as counts of microseconds."""
        assert self._loop_dir is not None
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10.0
        while not (new := set(self._loop_dir.glob(f"loop-{self.pid}-*.pstats")) - self._windows_before):
            if time.monotonic() > deadline:
                return Counter(), f"the worker wrote no profile to {self._loop_dir}"
            time.sleep(0.1)
        (window,) = new
        busy: Counter[str] = Counter()
        for (file, line, function), (_, _, own_s, _, _) in pstats.Stats(str(window)).stats.items():  # type: ignore[attr-defined]
            frame = _PATH.sub("(", f"{function} ({file}:{line})")
            if not any(i in frame for i in ("method 'poll' of 'select.epoll'", *IDLE)):
                busy[frame] += int(own_s * 1e6)
        return busy, str(window)
