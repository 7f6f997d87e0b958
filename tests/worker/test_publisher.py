"""The state publisher (pure asyncio): coalesced publishes, flush, heartbeats, retries."""

import asyncio
import threading

from apps.worker.publisher import StatePublisher


def _publisher(published, beats, *, fail=0, heartbeat_s=60.0):
    state = {"n": 0, "fail": fail}

    def snapshot():
        state["n"] += 1
        return {"snapshot": state["n"]}

    def publish(status):
        if state["fail"]:
            state["fail"] -= 1
            raise RuntimeError("database is locked")
        published.append(status["snapshot"])

    return StatePublisher(snapshot=snapshot, publish=publish, heartbeat=beats.append, heartbeat_s=heartbeat_s,
                          coalesce_s=0.05, retry_s=0.05)


def test_a_burst_of_changes_from_threads_costs_one_publish_and_flush_sees_it() -> None:
    published, beats = [], []

    async def scenario():
        publisher = _publisher(published, beats)
        task = asyncio.create_task(publisher.run())
        assert await publisher.flush()  # the start-up publish
        start = len(published)
        threads = [threading.Thread(target=publisher.changed) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        await asyncio.sleep(0.2)
        bursts = len(published) - start
        assert await publisher.flush()
        task.cancel()
        await publisher.close()
        return bursts

    bursts = asyncio.run(scenario())
    assert 1 <= bursts <= 2  # twenty changes, coalesced


def test_flush_waits_for_a_publish_that_started_after_it_and_retries_failures() -> None:
    published, beats = [], []

    async def scenario():
        publisher = _publisher(published, beats, fail=2)
        task = asyncio.create_task(publisher.run())
        assert await publisher.flush(timeout_s=5)
        task.cancel()
        return publisher.failures

    assert asyncio.run(scenario()) == 2 and published


def test_quiet_periods_heartbeat_instead_of_publishing() -> None:
    published, beats = [], []

    async def scenario():
        publisher = _publisher(published, beats, heartbeat_s=0.05)
        task = asyncio.create_task(publisher.run())
        await publisher.flush()
        n = len(published)
        await asyncio.sleep(0.3)
        task.cancel()
        return n

    n = asyncio.run(scenario())
    assert len(published) == n and len(beats) >= 2
