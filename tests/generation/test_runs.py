"""A generation's run loop (apps/generation/runs.py) with its model steps and writes stubbed."""

import asyncio
import contextlib
from concurrent.futures import Future

import numpy as np

from apps.generation.requests import GenerateRequest
from apps.generation.runs import GenerationRun
from apps.generation.sampling import SamplingParams


class _Model:
    def new_cache(self) -> None:
        return None


def _written(func, /, **kwargs) -> asyncio.Future:
    done: Future = Future()
    done.set_result(None)
    return asyncio.wrap_future(done)


def test_a_cancel_that_an_await_swallowed_still_ends_the_run_before_its_next_step() -> None:
    steps = []

    async def step(model_id, model, ids, cache, options, ctx, work, **kwargs):
        steps.append(len(ids))
        # an await deep in a step that takes a CancelledError for its own (a hedge's loser, say)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
        logits = np.zeros((1, 8), dtype=np.float32)
        logits[0, 3] = 1.0
        return logits, [], 0.0

    finishes = []

    def write(func, /, **kwargs):
        finishes.append(kwargs.get("finish_reason"))
        return _written(func)

    async def scenario():
        request = GenerateRequest(prompt_ids=[1, 2], max_new_tokens=50, sampling=SamplingParams(temperature=0.0),
                                  options={"allow_partial": False, "wire": None, "stop_at_eos": True})
        run = GenerationRun(generation_id="g", model_id="m", model=_Model(), codec=None, eos_ids=frozenset(),
                            request=request, step=step, write=write, record_work=lambda **kwargs: None)
        task = asyncio.create_task(run.run())
        await asyncio.sleep(0.12)  # inside its third step
        run.cancel(task)
        await task
        return run

    run = asyncio.run(scenario())
    assert len(steps) == 3 and run.tokens == [3, 3, 3]  # the step it was in ended; no other began
    assert finishes[-1] == "cancelled"
