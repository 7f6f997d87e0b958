"""Pushes to every open dashboard page (the Channels group DASHBOARD_GROUP).

Called from other apps' services inside `transaction.on_commit`, so a page never shows
a change that was rolled back.
"""

import asyncio
import logging
import os
import threading
from typing import Any

from channels.layers import get_channel_layer

DASHBOARD_GROUP = "dashboard"
PUSH_TIMEOUT_S = 5.0
logger = logging.getLogger(__name__)
_push_loop: tuple[int, asyncio.AbstractEventLoop] | None = None
_push_lock = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """This process's push loop, on a thread of its own. The channel layer keeps its Redis
    connections per event loop, and async_to_sync ran each push on a new loop: a new connection
    per push (a generation pushes every step). A forked child (Celery's pool) starts its own."""
    global _push_loop
    with _push_lock:
        if _push_loop is None or _push_loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="dashboard-push", daemon=True).start()
            _push_loop = (os.getpid(), loop)
        return _push_loop[1]


def dashboard_push(*, event: str, payload: dict[str, Any]) -> None:
    """Send `event` to all dashboards (sent when this returns); a Redis outage is logged, never
    raised into the caller."""
    layer = get_channel_layer()
    try:
        message = {"type": "dashboard.event", "event": event, "payload": payload}
        asyncio.run_coroutine_threadsafe(layer.group_send(DASHBOARD_GROUP, message), _loop()).result(PUSH_TIMEOUT_S)
    except Exception:
        logger.exception("could not push %s to dashboards", event)


def push_policy_activated(*, policy: dict[str, Any], **_: Any) -> None:
    """Receiver of governance's policy_activated: every dashboard shows the new policy live."""
    dashboard_push(event="policy.changed", payload={"policy": policy})


def push_receipts_kept(*, receipts: list[dict[str, Any]], **_: Any) -> None:
    """Receiver of receipts' receipts_kept: every dashboard lists the newly kept receipts live."""
    dashboard_push(event="receipts.kept", payload={"receipts": receipts})


def push_repair_pass(*, repair_pass: dict[str, Any], **_: Any) -> None:
    """Receiver of repair's repair_pass_done: every dashboard shows the pass as it ends."""
    dashboard_push(event="repair.pass", payload={"pass": repair_pass})


def push_holdings_changed(*, model_ids: list[str], **_: Any) -> None:
    """Receiver of providers' holdings_changed: open shard maps of those models refetch and redraw."""
    dashboard_push(event="shardmap.changed", payload={"model_ids": model_ids})


def push_dispute_decided(*, receipt_id: int, state: str, difference: float | None, tolerance: float | None,
                         **_: Any) -> None:
    """Receiver of receipts' dispute_decided: the receipts page shows the verdict live."""
    dashboard_push(event="receipts.dispute", payload={"receipt_id": receipt_id, "state": state,
                                                      "difference": difference, "tolerance": tolerance})


def push_prepare_progress(*, job: dict[str, Any], **_: Any) -> None:
    """Receiver of catalog's prepare_progressed (already coalesced there): the prepare page's bars."""
    dashboard_push(event="prepare.progress", payload={"job": job})


def push_forward_done(*, forward: dict[str, Any], **_: Any) -> None:
    """Receiver of forward's forward_recorded: the forwards page lists each forward as it ends."""
    dashboard_push(event="forward.done", payload={"forward": forward})


def push_node_processes(*, processes: dict[str, Any], **_: Any) -> None:
    """Receiver of node's node_processes_read: the node page's process list, pushed every tick."""
    dashboard_push(event="node.processes", payload=processes)


def push_runtime_status(*, status: dict[str, Any], **_: Any) -> None:
    """Receiver of worker's worker_state_published: the runtime card/page, after each publish or heartbeat."""
    dashboard_push(event="runtime.status", payload=status)


def push_providers_changed(*, changed: list[str], removed: list[str], alive: dict[str, int] | None = None,
                           **_: Any) -> None:
    """Receiver of providers' providers_changed: ids stored or dropped (the network page fetches their
    rows) and the fresh heartbeats' alive_ms by id (it moves their liveness in place)."""
    dashboard_push(event="network.changed", payload={"changed": changed, "removed": removed, "alive": alive or {}})


def push_generation_progress(*, generation: dict[str, Any], **_: Any) -> None:
    """Receiver of generation's generation_progressed (sent from the expert worker after each batch of
    steps commits): the generate page appends their tokens and fan-out live."""
    dashboard_push(event="generation.progress", payload={"generation": generation})


def push_generation_batching(*, batching: dict[str, Any], **_: Any) -> None:
    """Receiver of generation's generation_batching: the generate page's live view of the router's
    continuous batching (running and waiting generations, batch size per iteration, tokens/s)."""
    dashboard_push(event="generation.batching", payload={"batching": batching})
