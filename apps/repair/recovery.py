"""Repair's last resort: experts nobody holds any more, published again by the node that prepared them.

A repair pass re-replicates an expert from the blob its holders announce. When the last holder
leaves, nobody announces a blob and the pass has nothing to fetch. A node whose prepare jobs
published that expert still knows its source: the checkpoint, the quant and the blob hash
(apps.catalog.selectors.prepared_experts). It loads the expert again from its own blob store
(a prepare job's blobs are kept: apps/catalog/selectors.referenced_blob_hashes), or, when the store
no longer has the blob, queues the same prepare job again (slicing and quantizing are deterministic:
the same bytes, the same hash announced before) and loads the blob at a later pass, once the job
is done. The expert is then announced again, and ordinary repair re-replicates it from this copy.

An expert counts as lost when no holder in the view announces a blob of it (nobody holds it, or
only as inline payloads), two consecutive passes running (a view can miss holders for a moment).
A pass recovers at most the policy's per-pass limit of them (repair_max_experts_per_pass), beside
its adds, in an order of this node's own (recovery_order.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync

from apps.blobs.selectors import blob_store
from apps.blobs.store import blob_uri
from apps.catalog.models import JobState, PrepareJob
from apps.catalog.selectors import PreparedExpert
from apps.catalog.services import prepare_job_create
from apps.repair.models import RepairPass
from apps.repair.recovery_order import recovery_order
from apps.worker import client as worker
from core.errors import TenzroError

logger = logging.getLogger("tenzro.repair")
RECOVER = "recover"
Key = tuple[int, int]


def lost_experts(prepared: dict[Key, PreparedExpert], fetchable: Iterable[Key]) -> list[PreparedExpert]:
    """The experts prepared here that no holder in this pass's view announces a blob of (nobody
    holds them, or only as inline payloads: ordinary repair cannot copy them)."""
    announced = set(fetchable)
    return [p for key, p in sorted(prepared.items()) if key not in announced]


def lost_last_pass() -> dict[str, set[Key]]:
    """{model_id: experts} the previous pass found lost (its "recover" rows, whatever their outcome)."""
    last = RepairPass.objects.order_by("-started_at").only("rows").first()
    lost: dict[str, set[Key]] = {}
    for r in last.rows if last is not None else ():
        if r.get("action") == RECOVER:
            lost.setdefault(r["model_id"], set()).add((r["layer"], r["expert"]))
    return lost


def recover(model_id: str, lost: list[PreparedExpert], *, self_id: str, lost_before: set[Key], limit: int,
            ) -> tuple[list[dict[str, Any]], int]:
    """Act on each lost expert, in this node's recovery order (recovery_order.py); returns the
    outcomes and the recoveries left to this pass."""
    outcomes = []
    by_key = {(p.layer, p.expert): p for p in lost}
    for key in recovery_order(model_id, self_id, by_key):
        p = by_key[key]
        row = {"model_id": model_id, "layer": p.layer, "expert": p.expert, "action": RECOVER, "rank": None,
               "holders": 0, "target": None, "blob_uri": blob_uri(p.blob_hash)}
        if (p.layer, p.expert) not in lost_before:
            outcomes.append({**row, "outcome": "lost_pending",
                             "why": "no holder in this pass's view: recovered if the next pass sees none either"})
        elif limit <= 0:
            outcomes.append({**row, "outcome": "deferred", "why": "over this pass's limit"})
        else:
            limit -= 1
            outcomes.append({**row, **_recover_one(model_id, p, row["blob_uri"])})
    return outcomes, limit


def _recover_one(model_id: str, p: PreparedExpert, uri: str) -> dict[str, Any]:
    if blob_store().has(p.blob_hash):
        try:
            loaded = async_to_sync(worker.expert_load)(
                source={"blob_uri": uri}, expect={"model_id": model_id, "layer": p.layer, "expert": p.expert})
        except TenzroError as exc:
            return {"outcome": "skipped", "why": f"load failed ({exc.reason}): {exc.message}"}
        logger.warning("repair: %s layer %s expert %s had no holder left; loaded again from this node's blob %s",
                       model_id, p.layer, p.expert, p.blob_hash[:16])
        return {"outcome": "recovered", "why": "loaded from this node's blob store", "tier": loaded.get("tier")}
    running = [j for j in PrepareJob.objects.filter(model_id=model_id, layer=p.layer, dense_slices__isnull=True,
                                                    state__in=(JobState.QUEUED, JobState.RUNNING))
               if p.expert in j.experts]
    if running:
        return {"outcome": "reprepare_running", "why": f"prepare job {running[0].pk} is publishing it again",
                "job_id": str(running[0].pk)}
    try:
        job = prepare_job_create(model_id=model_id, layer=p.layer, experts=[p.expert], quant=p.quant,
                                 checkpoint=p.checkpoint)
    except TenzroError as exc:
        return {"outcome": "skipped", "why": f"could not prepare it again ({exc.reason}): {exc.message}"}
    logger.warning("repair: %s layer %s expert %s had no holder left and its blob is gone here; "
                   "prepare job %s publishes it again from %s", model_id, p.layer, p.expert, job.pk, p.checkpoint)
    return {"outcome": "reprepare_queued", "why": "its blob is gone here: prepared again from the checkpoint",
            "job_id": str(job.pk)}
