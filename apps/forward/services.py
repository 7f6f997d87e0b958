"""Writes of the distributed forward: holder penalties and the latencies the planner ranks by."""

from __future__ import annotations

from collections.abc import Iterable

from apps.forward.engine import Failure
from apps.forward.models import HolderPenalty
from apps.providers.services import provider_latency_record


def forward_outcome_record(*, model_id: str, failures: Iterable[Failure], latencies_ms: dict[str, float],
                           self_id: str) -> None:
    """One forward's failures become penalty rows; each winner's median latency is folded into
    its provider's measured latency (this node's own is not a network latency and is skipped)."""
    HolderPenalty.objects.bulk_create([
        HolderPenalty(provider_id=f.provider, reason=f.reason, message=f.message[:2000], model_id=model_id,
                      layer=f.layer, expert=f.expert, rows=f.rows)
        for f in failures])
    for provider_id, ms in latencies_ms.items():
        if provider_id != self_id:
            provider_latency_record(provider_id=provider_id, latency_ms=ms)
