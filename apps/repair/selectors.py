"""Reads of repair passes."""

from __future__ import annotations

from typing import Any

from apps.repair.models import RepairPass

PASS_FIELDS = ("id", "started_at", "finished_at", "duration_ms", "trigger", "interval_s", "max_admissions", "model_ids",
               "considered", "rows", "fetched", "dropped", "unrepairable", "unrepairable_count", "capped",
               "capped_count", "error")


def repair_passes(*, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent passes, newest first (one query)."""
    return list(RepairPass.objects.values(*PASS_FIELDS)[:limit])
