"""The default memory budget of a node that shares its host with other nodes.

Each expert worker registers itself in a host-wide folder (one small file per worker, named by
its pid); the default budget is BUDGET_FRACTION of the host's total memory divided by the
number of live workers registered there. So three nodes on one machine default to a fifth of
its memory each instead of three times 60 % of what was free when each started, and a node
that joins or leaves moves the others' share at their next check (`HostShare.budget`). An
explicit budget (TENZRO_MEMORY_BUDGET_BYTES, `tenzro node run --memory-budget`) is never
shared; one above the host's memory is refused (`check_explicit_budget`).

A worker killed without cleanup leaves its file behind; it stops counting once its pid is no
longer alive. Plain files and psutil, no Django.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from core.experts.tiered_cache import BUDGET_FRACTION, FALLBACK_BUDGET

log = logging.getLogger(__name__)


def host_memory_bytes() -> int | None:
    """Total memory of this host, None when it cannot be read."""
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:  # psutil missing, or /proc unreadable in a sandbox
        return None
    return total if total > 0 else None


def check_explicit_budget(budget_bytes: int) -> None:
    """ValueError naming both figures when a chosen budget is above the host's total memory."""
    total = host_memory_bytes()
    if total is not None and budget_bytes > total:
        raise ValueError(f"a memory budget of {budget_bytes} bytes ({budget_bytes / 2**30:.1f} GiB) is more than "
                         f"this host's {total} bytes ({total / 2**30:.1f} GiB) of memory")


def default_registry() -> Path:
    """One folder per host and user, shared by every node that user runs on it."""
    return Path(tempfile.gettempdir()) / f"tenzro-nodes-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


@dataclass
class HostShare:
    """This worker's entry in the host registry, and the default budget it implies."""

    registry: Path
    pid: int
    data_dir: str

    @classmethod
    def join(cls, data_dir: str | Path, *, registry: Path | None = None, pid: int | None = None) -> HostShare:
        share = cls(registry or default_registry(), pid or os.getpid(), str(data_dir))
        share.registry.mkdir(parents=True, exist_ok=True)
        (share.registry / f"{share.pid}.json").write_text(json.dumps({"pid": share.pid, "data_dir": share.data_dir}))
        return share

    def leave(self) -> None:
        (self.registry / f"{self.pid}.json").unlink(missing_ok=True)

    def nodes(self) -> int:
        """Live workers registered on this host, this one included; stale entries are removed."""
        live = 0
        for entry in self.registry.glob("*.json"):
            try:
                pid = int(entry.stem)
            except ValueError:
                continue
            if pid == self.pid or _alive(pid):
                live += 1
            else:
                entry.unlink(missing_ok=True)
        return max(live, 1)

    def budget(self) -> tuple[int, str]:
        """(default budget in bytes, a line saying how it was reached)."""
        total = host_memory_bytes()
        if total is None:
            return FALLBACK_BUDGET, f"memory budget {FALLBACK_BUDGET / 2**30:.1f} GiB: the host's memory cannot " \
                                    "be read (set TENZRO_MEMORY_BUDGET_BYTES or --memory-budget to choose)"
        nodes = self.nodes()
        budget = int(total * BUDGET_FRACTION / nodes)
        shared = "" if nodes == 1 else f", shared by {nodes} nodes on this host"
        return budget, (f"memory budget {budget / 2**30:.2f} GiB: {BUDGET_FRACTION:.0%} of the host's "
                        f"{total / 2**30:.1f} GiB{shared} (set TENZRO_MEMORY_BUDGET_BYTES or --memory-budget "
                        "to choose)")
