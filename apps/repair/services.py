"""Repair passes: pull-based re-replication (docs/specification.md, "Repair").

A pass covers the models this node holds experts of, and those its prepare jobs published. For
each, the gossip view (with this node's own published holdings, which may not be announced yet)
goes through the pure selection
(apps.repair.selection: rendezvous hashing over the providers declaring holdings of the model),
which names this node's rows; every other node computes the rows naming it from the same rule,
so nobody allocates memory on a peer and two nodes that share a view never race for a slot.

* An "add" row is admitted up to the policy's per-pass limit (most under-replicated first), then
  fetched from a holder's blob_uri (the worker verifies it by hash, stores and loads it, and
  publishes the holding; the next heartbeat announces it). A row whose expert does not fit the
  memory tier's free budget is skipped and says so; another candidate is not forced.
* An expert this node prepared that nobody holds any more (two passes running) is loaded again
  from this node's blob store, or prepared again from its checkpoint (apps/repair/recovery.py).
* A "drop" row (this node is a lowest-ranked holder of an expert above max_replication) unloads
  only at the second consecutive pass that sees the same holders with the same residency, so
  views that disagree for a moment do not make copies flap; nothing is ever dropped to make room.

The interval and the limit come from the active policy at every tick (`repair_tick`), with a
per-node jitter so a network does not repair in lockstep.
"""

from __future__ import annotations

import hashlib
import logging
import random
import statistics
import time
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import httpx
from asgiref.sync import async_to_sync
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.blobs.peers import blob_holders
from apps.blobs.store import parse_blob_uri
from apps.catalog.selectors import prepared_experts
from apps.governance.selectors import policy_active
from apps.node.selectors import node_identity
from apps.providers.selectors import holding_views
from apps.repair.models import RepairPass, RepairSchedule, TrimWatch
from apps.repair.recovery import lost_experts, lost_last_pass, recover
from apps.repair.selection import ExpertView, RepairRow, RepairRules, admit, select_repairs
from apps.repair.selectors import unrepairable_why
from apps.repair.signals import repair_pass_done
from apps.worker import client as worker
from apps.worker.selectors import holdings as worker_holdings
from apps.worker.selectors import worker_status_published
from core.errors import TenzroError

logger = logging.getLogger("tenzro.repair")
RUN_TASK = "tenzro.repair.run"
UNREPAIRABLE_LISTED = 100
Key = tuple[int, int]
Own = tuple[str, str | None, int, int]  # residency, blob_uri, demand (rows/s), capacity (rows/s)


def repair_tick(*, now: datetime | None = None) -> RepairPass | None:
    """Run a scheduled pass when one is due under the active policy; called every few seconds.

    Due = the last pass's start + repair_interval_s x this node's jitter (drawn per pass in
    [1 - j, 1 + j], j = TENZRO_REPAIR_JITTER; the first pass of a node comes after a uniform
    share of one interval), so a policy change applies from the next tick on."""
    now = now or timezone.now()
    interval = policy_active().repair_interval_s
    jitter = settings.TENZRO_REPAIR_JITTER
    with transaction.atomic():
        schedule, _ = RepairSchedule.objects.select_for_update().get_or_create(pk=1)
        if schedule.running_since and now - schedule.running_since < timedelta(seconds=max(600, 3 * interval)):
            return None  # a pass is running (one that crashed is forgotten after a while)
        if schedule.anchor_at is None:
            schedule.anchor_at, schedule.jitter = now, random.uniform(0.0, 1.0)
            schedule.save()
            return None
        if now < schedule.anchor_at + timedelta(seconds=interval * schedule.jitter):
            return None
        schedule.anchor_at, schedule.jitter = now, random.uniform(1.0 - jitter, 1.0 + jitter)
        schedule.running_since = now
        schedule.save()
    try:
        return repair_pass_run(trigger="schedule")
    finally:
        RepairSchedule.objects.filter(pk=1).update(running_since=None)


def repair_run_enqueue() -> None:
    """Queue a pass now (after commit), by the task's registered name: tasks.py imports this module."""
    transaction.on_commit(lambda: current_app.send_task(RUN_TASK))


def repair_next_due() -> datetime | None:
    schedule = RepairSchedule.objects.filter(pk=1).first()
    if schedule is None or schedule.anchor_at is None:
        return None
    return schedule.anchor_at + timedelta(seconds=policy_active().repair_interval_s * schedule.jitter)


def _own_holdings() -> dict[str, dict[Key, Own]]:
    """{model_id: {(layer, expert): (residency, blob_uri, demand, capacity)}} as the worker last published them."""
    mine: dict[str, dict[Key, Own]] = defaultdict(dict)
    for h in worker_holdings():
        mine[h["model_id"]][(h["layer"], h["expert"])] = (h["residency"], h["blob_uri"], h["committed_tps"],
                                                          h["capacity_tps"])
    return mine


def _model_view(model_id: str, self_id: str, mine: dict[Key, Own],
                ) -> tuple[list[ExpertView], list[str], dict[Key, str]]:
    """The model's experts as this node sees them (its own holdings live), the candidate providers,
    and per expert a digest of its holders and their residency (what "stable" compares).

    An expert's demand is the sum of its holders' committed_tps; one holder's capacity is the median
    of the capacity_tps its holders measured (docs/protocol.md, "Repair selection")."""
    holders: dict[Key, dict[str, str]] = defaultdict(dict)
    blobs: dict[Key, dict[str, str]] = defaultdict(dict)
    demand: dict[Key, float] = defaultdict(float)
    capacities: dict[Key, list[int]] = defaultdict(list)
    for h in holding_views(model_id):
        if h.provider_id == self_id:
            continue  # this node's announcement may lag: its published holdings stand instead
        key = (h.layer, h.expert)
        holders[key][h.provider_id] = h.residency
        demand[key] += h.committed_tps
        capacities[key].append(h.capacity_tps)
        if h.blob_uri:
            blobs[key][h.provider_id] = h.blob_uri
    for key, (residency, blob, tps, capacity) in mine.items():
        holders[key][self_id] = residency
        demand[key] += tps
        capacities[key].append(capacity)
        if blob:
            blobs[key][self_id] = blob
    experts = [ExpertView(layer, expert, tuple(sorted(held)),
                          blobs[(layer, expert)][min(blobs[(layer, expert)])] if blobs[(layer, expert)] else None,
                          demand[(layer, expert)], _median_measured(capacities[(layer, expert)]))
               for (layer, expert), held in sorted(holders.items())]
    candidates = sorted({pid for held in holders.values() for pid in held})
    digests = {key: hashlib.blake2b(repr(sorted(held.items())).encode(), digest_size=16).hexdigest()
               for key, held in holders.items()}
    return experts, candidates, digests


def _median_measured(capacities: list[int]) -> float:
    """The median of the capacities holders measured (0 when none has measured any)."""
    measured = [c for c in capacities if c > 0]
    return float(statistics.median(measured)) if measured else 0.0


def repair_pass_run(*, trigger: str) -> RepairPass:
    """One pass over every model this node holds experts of; the record says what happened."""
    policy = policy_active()
    self_id = node_identity().provider_id
    started, clock = timezone.now(), time.perf_counter()
    rules = RepairRules(policy.min_replication, policy.max_replication, float(policy.hot_threshold_tps),
                        float(policy.repair_headroom))
    record = RepairPass(started_at=started, trigger=trigger, interval_s=policy.repair_interval_s,
                        max_admissions=policy.repair_max_experts_per_pass)
    mine = _own_holdings()
    prepared = prepared_experts()  # what this node can publish again when nobody holds it (recovery.py)
    lost_before = lost_last_pass() if prepared else {}  # read once: the previous pass, not one per model
    record.model_ids = sorted(set(mine) | set(prepared))
    unrepairable: list[list[Any]] = []
    capped: list[list[Any]] = []
    outcomes: list[dict[str, Any]] = []
    budget = _free_memory_bytes()
    left = policy.repair_max_experts_per_pass
    recover_left = policy.repair_max_experts_per_pass  # recoveries have a limit of their own, beside the adds
    try:
        for model_id in record.model_ids:
            experts, candidates, digests = _model_view(model_id, self_id, mine.get(model_id, {}))
            chosen = select_repairs(model_id, experts, candidates, rules, only=self_id)
            record.considered += chosen.considered
            unrepairable += [[model_id, layer, expert, why] for layer, expert, why in chosen.unrepairable]
            capped += [[model_id, *row] for row in chosen.capped]
            admitted, deferred = admit(chosen.rows, left)
            for row in admitted:
                if row.action == "add":
                    left -= 1
                    outcome, budget = _fetch(model_id, row, budget)
                else:
                    outcome = _trim(model_id, row, digests[(row.layer, row.expert)])
                outcomes.append(outcome)
            outcomes += [{**_row(model_id, row), "outcome": "deferred",
                          "why": f"over this pass's limit of {policy.repair_max_experts_per_pass}"} for row in deferred]
            if model_id in prepared:
                lost = lost_experts(prepared[model_id], ((e.layer, e.expert) for e in experts if e.blob_uri))
                recovered, recover_left = recover(model_id, lost, self_id=self_id,
                                                  lost_before=lost_before.get(model_id, set()),
                                                  limit=recover_left)
                outcomes += recovered
            TrimWatch.objects.filter(model_id=model_id).exclude(
                pk__in=[o["watch"] for o in outcomes if o.get("watch")]).delete()
    except Exception as exc:  # the record says the pass broke off; the next one starts afresh
        logger.exception("repair pass failed")
        record.error = f"{type(exc).__name__}: {exc}"
    record.rows = [{k: v for k, v in o.items() if k != "watch"} for o in outcomes]
    record.fetched = sum(o["outcome"] in ("fetched", "recovered") for o in outcomes)
    record.dropped = sum(o["outcome"] == "dropped" for o in outcomes)
    record.unrepairable_count = len(unrepairable)
    record.unrepairable = unrepairable[:UNREPAIRABLE_LISTED]
    record.capped_count = len(capped)
    record.capped = capped[:UNREPAIRABLE_LISTED]
    record.finished_at = timezone.now()
    record.duration_ms = round((time.perf_counter() - clock) * 1000.0, 3)
    record.save()
    summary = {"id": record.pk, "started_at": record.started_at.isoformat(), "trigger": trigger,
               "considered": record.considered, "fetched": record.fetched, "dropped": record.dropped,
               "unrepairable": record.unrepairable_count, "capped": record.capped_count, "error": record.error,
               "unrepairable_why": unrepairable_why(record.unrepairable, record.unrepairable_count),
               "rows": record.rows[:20]}
    transaction.on_commit(lambda: repair_pass_done.send(sender=RepairPass, repair_pass=summary))
    logger.info("repair pass %s: %s considered, %s fetched, %s dropped, %s unrepairable, %s capped", record.pk,
                record.considered, record.fetched, record.dropped, record.unrepairable_count, record.capped_count)
    return record


def _row(model_id: str, row: RepairRow) -> dict[str, Any]:
    return {"model_id": model_id, "layer": row.layer, "expert": row.expert, "action": row.action, "rank": row.rank,
            "holders": row.holders, "target": row.target, "blob_uri": row.blob_uri}


def _free_memory_bytes() -> int | None:
    """What the memory tier can still take, as the worker last published it (None: never published)."""
    status = worker_status_published()
    budget, used = status.get("memory_budget_bytes"), status.get("memory_used_bytes")
    return None if budget is None or used is None else max(0, int(budget) - int(used))


def _blob_size(hash_: str) -> int | None:
    """The blob's size from a peer that announces it (HEAD): checked against the budget before fetching."""
    urls = dict.fromkeys([*(h.http_endpoint for h in blob_holders(hash_) if h.http_endpoint), *settings.TENZRO_PEERS])
    for url in urls:
        try:
            response = httpx.head(f"{url.rstrip('/')}/blobs/{hash_}", timeout=5.0)
        except httpx.HTTPError:
            continue
        if response.status_code == 200 and response.headers.get("content-length", "").isdigit():
            return int(response.headers["content-length"])
    return None


def _fetch(model_id: str, row: RepairRow, budget: int | None) -> tuple[dict[str, Any], int | None]:
    """Fetch and load one expert this node was chosen for; returns its outcome and the budget left."""
    out = _row(model_id, row)
    assert row.blob_uri is not None  # the selection never names a row without one
    size = _blob_size(parse_blob_uri(row.blob_uri))
    if size is None:
        return {**out, "outcome": "skipped", "why": "no peer announcing the blob answered"}, budget
    if budget is not None and size > budget:
        return {**out, "outcome": "skipped", "why": f"memory budget: the expert needs {size} bytes, "
                                                      f"{budget} are free in the memory tier"}, budget
    try:
        loaded = async_to_sync(worker.expert_load)(
            source={"blob_uri": row.blob_uri}, expect={"model_id": model_id, "layer": row.layer, "expert": row.expert})
    except TenzroError as exc:
        return {**out, "outcome": "skipped", "why": f"fetch failed ({exc.reason}): {exc.message}"}, budget
    logger.info("repair: fetched %s layer %s expert %s (%s bytes) from %s", model_id, row.layer, row.expert, size,
                row.blob_uri)
    return ({**out, "outcome": "fetched", "bytes": size, "tier": loaded.get("tier")},
            None if budget is None else budget - size)


def _trim(model_id: str, row: RepairRow, digest: str) -> dict[str, Any]:
    """An extra copy above max_replication: unloaded at the second pass that sees the same holders."""
    out = _row(model_id, row)
    watch, created = TrimWatch.objects.get_or_create(model_id=model_id, layer=row.layer, expert=row.expert,
                                                     defaults={"holders_digest": digest})
    if not created:
        if watch.holders_digest == digest:
            watch.passes += 1
        else:
            watch.holders_digest, watch.passes = digest, 1
        watch.save()
    if watch.passes < 2:
        return {**out, "outcome": "drop_pending", "why": "holders must stay the same for two passes",
                "watch": watch.pk}
    try:
        async_to_sync(worker.expert_unload)(model_id=model_id, layer=row.layer, expert=row.expert)
    except TenzroError as exc:
        return {**out, "outcome": "skipped", "why": f"unload failed ({exc.reason}): {exc.message}", "watch": watch.pk}
    watch.delete()
    return {**out, "outcome": "dropped"}
