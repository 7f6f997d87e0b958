"""The event loop's own profiler (core/loop_profile.py): a SIGUSR1 window, its stats on disk."""

import asyncio
import os
import pstats
import signal

from core.loop_profile import LoopProfiler


def busy_on_the_loop() -> int:
    return sum(i * i for i in range(20_000))


def test_two_sigusr1_make_one_window_whose_stats_name_what_the_loop_ran(tmp_path) -> None:
    async def scenario() -> list:
        loop = asyncio.get_running_loop()
        LoopProfiler(tmp_path / "profiles").install(loop)
        busy_on_the_loop()  # before the window: not in it
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.05)  # the handler runs on the loop
        for _ in range(3):
            loop.call_soon(busy_on_the_loop)
            await asyncio.sleep(0)
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.05)
        loop.remove_signal_handler(signal.SIGUSR1)
        return sorted((tmp_path / "profiles").iterdir())

    (window,) = asyncio.run(scenario())
    assert window.name.startswith(f"loop-{os.getpid()}-") and window.suffix == ".pstats"
    calls = {function: stats[1] for (_, _, function), stats in pstats.Stats(str(window)).stats.items()}
    assert calls["busy_on_the_loop"] == 3
