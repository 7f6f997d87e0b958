"""A record of the faults an end-to-end run injected, for the summary table the suite prints.

Each test that injects a fault (kills a holder, stops one, drops Redis, kills the Celery
worker, corrupts a blob) opens an entry when it injects it and closes it once every
invariant held: survived, and how much was lost (forwards answered wrongly or not at all,
jobs or settlements lost, payments made twice), which must be 0. tests/conftest.py hands
tests a FaultLog and prints the table at the end of the pytest run (even with -q), so an
entry never closed reads as not survived.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Fault:
    name: str
    injected: str
    test: str
    observed: list[str] = field(default_factory=list)
    survived: bool = False
    lost: int | None = None  # None: the test did not get as far as counting

    def observe(self, what: str) -> None:
        self.observed.append(what)
        print(f"[fault] {self.name}: observed {what}")

    def close(self, *, lost: int) -> None:
        """Every invariant held; `lost` as counted by the test (it asserts 0 itself)."""
        self.lost = lost
        self.survived = lost == 0
        print(f"[fault] {self.name}: survived={self.survived} data lost={lost}")


@dataclass
class FaultLog:
    test: str
    faults: list[Fault]

    def inject(self, name: str, injected: str) -> Fault:
        fault = Fault(name=name, injected=injected, test=self.test)
        self.faults.append(fault)
        print(f"[fault] {name}: injected {injected}")
        return fault


def summary_lines(faults: list[Fault], width: int = 60) -> list[str]:
    """fault | injected | survived | data lost, one row per fault, in injection order."""
    def cut(text: str) -> str:
        return text if len(text) <= width else text[:width - 1] + "…"

    rows = [("fault", "injected", "survived", "data lost")]
    rows += [(cut(f.name), cut(f.injected), "yes" if f.survived else "NO",
              "?" if f.lost is None else str(f.lost)) for f in faults]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    total_lost = sum(f.lost or 0 for f in faults)
    lines.append(f"{len(faults)} faults injected, {sum(f.survived for f in faults)} survived, "
                 f"data lost {total_lost}")
    return lines
