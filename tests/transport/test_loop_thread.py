"""LoopThread: one loop for a process's synchronous callers, kept between calls, its own in a fork."""

import asyncio
import multiprocessing
import threading

import pytest

from core.transport.loop_thread import LoopThread


@pytest.fixture
def loops():
    made: list[LoopThread] = []

    def make(name: str = "test-loop") -> LoopThread:
        made.append(LoopThread(name))
        return made[-1]

    yield make
    for loop_thread in made:
        loop_thread.stop()


async def _where() -> tuple[asyncio.AbstractEventLoop, str]:
    return asyncio.get_running_loop(), threading.current_thread().name


def test_calls_run_on_one_loop_in_its_own_thread_and_keep_what_they_made(loops) -> None:
    runner = loops("kept")
    first_loop, thread = runner.run(_where(), timeout_s=5)
    second_loop, _ = runner.run(_where(), timeout_s=5)
    assert first_loop is second_loop and thread == "kept" and thread != threading.current_thread().name

    async def remember() -> int:  # state made by one call is there for the next, as a pool's connections are
        loop = asyncio.get_running_loop()
        loop.seen = getattr(loop, "seen", 0) + 1  # type: ignore[attr-defined]
        return loop.seen  # type: ignore[attr-defined]

    assert [runner.run(remember(), timeout_s=5) for _ in range(3)] == [1, 2, 3]


def test_a_call_past_its_timeout_is_cancelled_and_the_loop_serves_the_next(loops) -> None:
    runner = loops()
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError, match=r"not done within 0\.2 s"):
        runner.run(forever(), timeout_s=0.2)
    assert cancelled.wait(5)
    assert runner.run(asyncio.sleep(0, result="next"), timeout_s=5) == "next"


def test_errors_reach_the_caller_and_a_call_from_the_loop_itself_is_refused(loops) -> None:
    runner = loops()

    async def fails() -> None:
        raise ValueError("from the loop")

    with pytest.raises(ValueError, match="from the loop"):
        runner.run(fails(), timeout_s=5)

    async def nested() -> None:
        runner.run(asyncio.sleep(0), timeout_s=1)  # would wait for itself for ever

    with pytest.raises(RuntimeError, match="called from its own loop"):
        runner.run(nested(), timeout_s=5)


def _child(runner: LoopThread, parent_loop: int, answers: multiprocessing.Queue) -> None:
    loop, _ = runner.run(_where(), timeout_s=5)  # the parent's loop is in this memory too, not running
    answers.put(id(loop) != parent_loop and loop.is_running())


def test_a_forked_child_starts_a_loop_of_its_own(loops) -> None:
    """Celery's prefork pool forks after the parent may have started one: the child has no such thread."""
    runner = loops()
    parent_loop, _ = runner.run(_where(), timeout_s=5)
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_child, args=(runner, id(parent_loop), answers))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and answers.get(timeout=5) is True
