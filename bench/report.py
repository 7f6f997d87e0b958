"""Shared output for the benchmarks: a printed table and a JSON file under bench/results/.

Every benchmark compares against a reference measured in the same run (numpy's sgemm,
the `gguf` package's kernels, memory bandwidth, a plain loopback socket) and reports the
ratio, so numbers from different machines stay comparable.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """Print rows under a title as an aligned plain-text table."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in text_rows)) if text_rows else len(c) for i, c in enumerate(columns)]
    print(f"\n== {title} ==")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in text_rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def headline(name: str, value: float | None, unit: str, *, reference: str = "—",
             reference_value: float | None = None, target: str = "—") -> dict[str, Any]:
    """One headline figure in the shape bench/summary.py reads: the figure, its reference measured in
    the same run, their ratio (value / reference_value, None when either is missing or 0), and the
    target the issue or docs/operations.md sets ("—" where none was set)."""
    ratio = value / reference_value if value is not None and reference_value else None
    return {"name": name, "value": value, "unit": unit, "reference": reference, "reference_value": reference_value,
            "ratio": ratio, "target": target}


def write_results(name: str, payload: dict[str, Any], headlines: list[dict[str, Any]] | None = None) -> Path:
    """Write `payload` (plus machine facts) to bench/results/<name>.json and return the path.

    `headlines` (see `headline`) go under "headline", where `make bench`'s summary finds them."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "processor": platform.processor(),
                    "machine": platform.machine()},
        **payload,
    }
    if headlines is not None:
        document["headline"] = headlines
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {path.relative_to(RESULTS_DIR.parent.parent)}")
    return path


@dataclass(frozen=True)
class Timing:
    median_s: float  # wall clock
    best_s: float  # wall clock
    cpu_s: float  # median process CPU time: what a busy machine inflates least (time waiting for a core is not in it)

    def cell(self) -> str:
        return f"{self.median_s * 1e3:.4g} [{self.best_s * 1e3:.4g}] cpu {self.cpu_s * 1e3:.4g}"

    def to_dict(self) -> dict[str, float]:
        return {"median_ms": self.median_s * 1e3, "best_ms": self.best_s * 1e3, "cpu_median_ms": self.cpu_s * 1e3}


def timed(fn: Callable[[], Any], repeat: int) -> tuple[Timing, Any]:
    """Timing of `repeat` calls, and the last call's result."""
    wall, cpu, result = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return Timing(float(np.median(wall)), min(wall), float(np.median(cpu))), result
