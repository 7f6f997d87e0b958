"""The worker's method table (pure): which door serves what, errors, deadlines."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.worker.doors import METHOD_DOORS, OPERATOR_ONLY, CallContext, Door, MethodTable
from core.errors import NotFound

PEER_METHODS = {"moe/status", "moe/execute", "blob/get", "gossip/push", "gossip/sync", "gossip/dialback",
                "receipt/verify"}


def _table(**overrides):
    async def ok(params, body, ctx):
        return {"echo": params}, bytes(body)

    return MethodTable({**dict.fromkeys(METHOD_DOORS, ok), **overrides})


def test_the_peer_door_serves_exactly_status_execute_blob_reads_gossip_and_verify() -> None:
    assert {m for m, doors in METHOD_DOORS.items() if Door.PEER in doors} == PEER_METHODS
    assert all(Door.OPERATOR in doors for doors in METHOD_DOORS.values())


@pytest.mark.parametrize("method", sorted(m for m, d in METHOD_DOORS.items() if d == OPERATOR_ONLY))
def test_operator_methods_are_refused_on_the_peer_door_before_their_handler_runs(method) -> None:
    ran = []

    async def handler(params, body, ctx):
        ran.append(method)
        return {}, b""

    table = _table(**{method: handler})
    reply = asyncio.run(table.call(method, {}, b"", CallContext(Door.PEER, peer=("10.0.0.9", 4000))))
    assert reply.header["ok"] is False and reply.header["error"]["reason"] == "forbidden"
    assert method in reply.header["error"]["message"] and "operator" in reply.header["error"]["message"]
    assert ran == [] and table.counts["peer.forbidden"] == 1
    assert asyncio.run(table.call(method, {}, b"", CallContext(Door.OPERATOR))).header["ok"] is True


def test_a_handler_without_a_declared_door_stops_the_worker_from_starting() -> None:
    async def handler(params, body, ctx):
        return {}, b""

    with pytest.raises(ValueError, match="moe/new_thing"):
        _table(**{"moe/new_thing": handler})
    with pytest.raises(ValueError, match="moe/execute"):
        MethodTable({m: handler for m in METHOD_DOORS if m != "moe/execute"})


def test_errors_become_error_replies_with_their_reason() -> None:
    async def missing(params, body, ctx):
        raise NotFound("expert 3 is not loaded", reason="expert_not_loaded")

    async def bug(params, body, ctx):
        raise ZeroDivisionError

    table = _table(**{"moe/execute": missing, "moe/status": bug})
    ctx = CallContext(Door.PEER)
    assert asyncio.run(table.call("moe/execute", {}, b"", ctx)).header["error"]["reason"] == "expert_not_loaded"
    assert asyncio.run(table.call("moe/status", {}, b"", ctx)).header["error"]["reason"] == "internal_error"
    assert asyncio.run(table.call("moe/nope", {}, b"", ctx)).header["error"]["reason"] == "method_not_found"


def test_a_call_whose_deadline_passed_in_the_queue_is_dropped_without_computing() -> None:
    computed = []
    gate = threading.Event()
    executor = ThreadPoolExecutor(max_workers=1)

    async def scenario():
        ctx_slow = CallContext(Door.OPERATOR)
        ctx_late = CallContext(Door.OPERATOR, deadline=time.time() + 0.1)
        blocker = asyncio.ensure_future(ctx_slow.run_blocking(executor, gate.wait, 5))
        queued = asyncio.ensure_future(ctx_late.run_blocking(executor, computed.append, "late"))
        await asyncio.sleep(0.3)  # the late call waits behind the blocker past its deadline
        gate.set()
        await blocker
        with pytest.raises(Exception) as info:
            await queued
        return info.value

    error = asyncio.run(scenario())
    assert getattr(error, "reason", None) == "deadline_exceeded" and computed == []
    executor.shutdown()


def test_a_call_arriving_after_its_deadline_is_not_started() -> None:
    table = _table()
    reply = asyncio.run(table.call("moe/status", {}, b"", CallContext(Door.OPERATOR, deadline=time.time() - 1)))
    assert reply.header["error"]["reason"] == "deadline_exceeded"
    assert table.counts["operator.dropped_past_deadline"] == 1
