"""A generation's run loop (apps/generation/runs.py) with its model steps and writes stubbed."""

import asyncio
import contextlib
from concurrent.futures import Future

import numpy as np

from apps.generation.model import greedy_generate
from apps.generation.requests import GenerateRequest
from apps.generation.runs import GenerationRun
from apps.generation.sampling import SamplingParams


class _Model:
    def new_cache(self, capacity: int = 0) -> None:
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


OPTIONS = {"allow_partial": False, "wire": None, "stop_at_eos": False}


def _finishes() -> tuple[list, object]:
    ends = []

    def write(func, /, **kwargs):
        if "finish_reason" in kwargs:
            ends.append(kwargs)
        return _written(func)

    return ends, write


def test_a_prompt_prefilled_in_chunks_gives_the_tokens_it_gives_in_one_step(fixture) -> None:
    model, prompt = fixture.model, fixture.expected["prompt_ids"] * 3
    alone = greedy_generate(model, prompt, 5, fixture.moe)
    sizes = []

    async def step(model_id, m, ids, cache, options, ctx, work):
        sizes.append(len(ids))
        return model.forward(ids, cache, fixture.moe, last_only=True), [{"layer": 1}], 0.0

    ends, write = _finishes()
    request = GenerateRequest(prompt_ids=prompt, max_new_tokens=5, sampling=SamplingParams(temperature=0.0),
                              options=OPTIONS)
    run = GenerationRun(generation_id="g", model_id="m", model=model, codec=None, eos_ids=frozenset(),
                        request=request, step=step, write=write, record_work=lambda **kwargs: None, prefill_chunk=4)
    asyncio.run(run.run())
    assert run.tokens == alone and ends[-1]["finish_reason"] == "length"
    chunks = -(-len(prompt) // 4)
    assert sizes == [4] * (chunks - 1) + [len(prompt) - 4 * (chunks - 1)] + [1] * 4


def test_a_generation_past_its_deadline_ends_with_deadline_exceeded_and_keeps_its_tokens() -> None:
    async def step(model_id, model, ids, cache, options, ctx, work):
        await asyncio.sleep(0.05)
        logits = np.zeros((1, 8), dtype=np.float32)
        logits[0, 2] = 1.0
        return logits, [], 0.0

    ends, write = _finishes()
    request = GenerateRequest(prompt_ids=[1], max_new_tokens=100, sampling=SamplingParams(temperature=0.0),
                              options=OPTIONS, deadline_s=0.12)
    run = GenerationRun(generation_id="g", model_id="m", model=_Model(), codec=None, eos_ids=frozenset(),
                        request=request, step=step, write=write, record_work=lambda **kwargs: None)
    asyncio.run(run.run())
    assert 1 <= len(run.tokens) <= 3 and set(run.tokens) == {2}
    assert ends[-1]["finish_reason"] == "error" and ends[-1]["error_reason"] == "deadline_exceeded"
    assert "deadline of 0.12 s" in ends[-1]["error_message"]
