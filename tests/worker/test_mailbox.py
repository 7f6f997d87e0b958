"""The web↔worker mailboxes (apps/worker/mailbox.py) and a generation's event stream over them,
against the real Redis."""

import asyncio

import pytest

from apps.node.selectors import redis_client
from apps.worker import mailbox
from apps.worker.streams import EventStream, new_stream, stream_events, stream_key
from core.errors import Unavailable


def test_messages_are_taken_in_order_with_their_bytes_and_the_mailbox_expires() -> None:
    key = f"tenzro:test:{new_stream()}"

    async def scenario():
        await mailbox.post(key, {"n": 1, "body": b"\x00\xff"}, {"n": 2})
        await mailbox.post(key, {"n": 3})
        taken = [await mailbox.take(key, 1.0) for _ in range(3)]
        return taken, redis_client().ttl(key), await mailbox.take(key, 0.05)

    taken, ttl, empty = asyncio.run(scenario())
    assert [m["n"] for m in taken] == [1, 2, 3] and taken[0]["body"] == b"\x00\xff"
    assert ttl == -2  # emptied: gone
    assert empty is None


def test_a_message_nobody_takes_expires_with_its_mailbox() -> None:
    key = f"tenzro:test:{new_stream()}"
    asyncio.run(mailbox.post(key, {"n": 1}))
    assert 0 < redis_client().ttl(key) <= mailbox.MAILBOX_EXPIRY_S
    redis_client().delete(key)


def test_a_stream_delivers_every_event_in_order_then_ends() -> None:
    name = new_stream()

    async def scenario():
        stream = EventStream(name)
        for i in range(50):
            await stream.put({"type": "token", "index": i})
        await stream.put({"type": "end"})
        await stream.close()
        return [event async for event in stream_events(name, idle_timeout_s=2.0)]

    events = asyncio.run(scenario())
    assert [e.get("index") for e in events[:-1]] == list(range(50)) and events[-1]["type"] == "end"
    assert redis_client().exists(stream_key(name)) == 0


def test_a_silent_stream_is_reported_unavailable_after_its_idle_timeout() -> None:
    async def scenario():
        return [event async for event in stream_events(new_stream(), idle_timeout_s=0.2)]

    with pytest.raises(Unavailable) as silent:
        asyncio.run(scenario())
    assert silent.value.reason == "worker_unavailable"


def test_a_reader_whose_cancel_an_await_swallowed_ends_cancelled_at_its_next_take() -> None:
    """Python 3.11's wait_for drops a cancel that lands as its future completes (CPython gh-86296), and
    redis-py's commands await it: the cancel must still end the reader's wait, not the mailbox's timeout."""
    key = f"tenzro:test:{new_stream()}"
    reached: list[str] = []

    async def reader() -> dict | None:
        done = asyncio.ensure_future(asyncio.sleep(0))
        await done
        asyncio.current_task().cancel()
        await asyncio.wait_for(done, timeout=10)  # on 3.11 the cancel is swallowed here; on 3.12 it raises
        reached.append("take")
        return await mailbox.take(key, 30.0)

    async def scenario() -> None:
        task = asyncio.create_task(reader())
        await asyncio.sleep(0.3)
        await mailbox.post(key, {"n": 1})  # a message that must not be taken by a cancelled reader
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())
    assert redis_client().llen(key) == 1
    redis_client().delete(key)
    assert reached in ([], ["take"])
