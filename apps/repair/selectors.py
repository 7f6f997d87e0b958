"""Reads of repair passes."""

from __future__ import annotations

from collections import Counter
from typing import Any

from apps.repair.models import RepairPass
from apps.repair.selection import NO_BLOB_URI, NO_CANDIDATE

PASS_FIELDS = ("id", "started_at", "finished_at", "duration_ms", "trigger", "interval_s", "max_admissions", "model_ids",
               "considered", "rows", "fetched", "dropped", "unrepairable", "unrepairable_count", "capped",
               "capped_count", "error")


# What each reason an expert could not be repaired means, for people (apps/repair/selection.py).
UNREPAIRABLE_MEANING = {NO_BLOB_URI: "no holder announces a blob to fetch it from",
                        NO_CANDIDATE: "no provider without it can take another copy"}


def unrepairable_why(unrepairable: list[list[Any]], count: int) -> str:
    """One line: each reason among a pass's unrepairable experts, how many, and what it means.
    ``unrepairable``: the pass's listed [model_id, layer, expert, reason] (the first 100 of ``count``)."""
    reasons = Counter(str(item[3]) for item in unrepairable if len(item) > 3)
    parts = [f"{n} {reason}: {UNREPAIRABLE_MEANING.get(reason, reason)}" for reason, n in reasons.most_common()]
    unlisted = count - len(unrepairable)
    return "; ".join(parts) + (f"; {unlisted} more not listed" if unlisted > 0 else "")


def repair_passes(*, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent passes, newest first (one query), each with its unrepairable experts' reasons."""
    passes = list(RepairPass.objects.values(*PASS_FIELDS)[:limit])
    for p in passes:
        p["unrepairable_why"] = unrepairable_why(p["unrepairable"], p["unrepairable_count"])
    return passes
