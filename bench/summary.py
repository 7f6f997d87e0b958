"""bench/results/summary.md: every benchmark's headline figures beside their references and targets.

    .venv/bin/python -m bench.summary

`make bench` runs it after the benchmarks. It reads every bench/results/*.json; each carries
a "headline" list (bench/report.py, `headline`): a figure, the reference measured in the same
run, their ratio, and the target the issue or docs/operations.md sets ("—" where none was
set). A benchmark of bench/ with no result file (not run, or failed) is listed as missing; a
result file without headlines says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .report import RESULTS_DIR

BENCH_DIR = Path(__file__).resolve().parent
NOT_BENCHMARKS = {"report", "summary"}


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def benchmarks() -> list[str]:
    return sorted(p.stem for p in BENCH_DIR.glob("[a-z]*.py") if p.stem not in NOT_BENCHMARKS)


def render(results_dir: Path = RESULTS_DIR) -> str:
    lines = ["# Benchmark summary", "",
             "Each headline figure beside its reference (measured in the same run) and its target; ratio = "
             "figure / reference. Written by `python -m bench.summary` from bench/results/*.json.", ""]
    found = {p.stem: p for p in sorted(results_dir.glob("*.json"))}
    missing = [name for name in benchmarks() if name not in found]
    for name, path in found.items():
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            lines += [f"## {name}", "", f"unreadable result file: {exc}", ""]
            continue
        lines += [f"## {name}", "", f"run {document.get('timestamp', '?')}", ""]
        heads = document.get("headline")
        if not heads:
            lines += ["no headline figures in this result file (written before they were added?)", ""]
            continue
        lines += ["| figure | value | unit | reference | reference value | ratio | target |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for h in heads:
            lines.append("| " + " | ".join(_fmt(h.get(k)) for k in (
                "name", "value", "unit", "reference", "reference_value", "ratio", "target")) + " |")
        lines.append("")
    if missing:
        lines += ["## Missing", "", "No result file (not run in this `make bench`, or it failed): "
                  + ", ".join(missing) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "summary.md"
    path.write_text(render())
    print(path.read_text())
    print(f"wrote {path.relative_to(BENCH_DIR.parent)}")


if __name__ == "__main__":
    main()
