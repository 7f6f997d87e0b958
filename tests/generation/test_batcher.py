"""Continuous batching (apps/generation/batcher.py): generations of one model asking at the same time
share each step's MoE calls, join and leave between iterations, and each gets the tokens it gets alone."""

from __future__ import annotations

import asyncio

import numpy as np

from apps.forward.ledger import ForwardWork
from apps.generation.batcher import StepBatcher
from apps.generation.model import greedy_generate
from apps.generation.sampling import Sampler, SamplingParams

NEW_TOKENS = 6
OPTIONS = {"allow_partial": False, "wire": None, "stop_at_eos": True}


class _Network:
    """drive() as the router's, with the fixture's local experts behind a 1 ms 'round trip' per layer."""

    def __init__(self, fixture) -> None:
        self.fixture, self.calls = fixture, []

    async def drive(self, model_id, gen, options, ctx, work):
        try:
            layer, x = next(gen)
            while True:
                self.calls.append((layer, len(x)))
                await asyncio.sleep(0.001)
                layer, x = gen.send(self.fixture.moe(layer, x))
        except StopIteration as done:
            return done.value, [{"layer": 0, "ms": 1.0}], 0.0


async def _generate(batcher, model, prompt, new_tokens, *, delay_s=0.0, seed=None):
    await asyncio.sleep(delay_s)
    seat = batcher.seat("m", model, OPTIONS)
    sampler = Sampler(SamplingParams(temperature=0.9, top_p=0.95, seed=seed), prompt) if seed is not None else None
    try:
        cache, tokens, ids = model.new_cache(), [], np.array(prompt)
        for _ in range(new_tokens):
            logits, layers, _ = await seat.step("m", model, ids, cache, OPTIONS, None, ForwardWork())
            tokens.append(sampler.choose(logits[-1]).token if sampler else int(np.argmax(logits[-1])))
            ids = np.array(tokens[-1:])
        return tokens, layers
    finally:
        seat.leave()


def test_concurrent_generations_share_each_iteration_and_get_their_own_tokens(fixture) -> None:
    model = fixture.model
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, model.spec.vocab_size, size=int(rng.integers(1, 10))).tolist() for _ in range(8)]
    alone = [greedy_generate(model, p, NEW_TOKENS, fixture.moe) for p in prompts]
    network = _Network(fixture)
    batcher = StepBatcher(network.drive, lambda **kwargs: None, wait_s=0.05)

    async def scenario():
        first = [_generate(batcher, model, p, NEW_TOKENS) for p in prompts[:6]]
        late = [_generate(batcher, model, p, NEW_TOKENS, delay_s=0.02) for p in prompts[6:]]  # join mid-way
        cancelled = asyncio.create_task(_generate(batcher, model, prompts[0], 100))
        results = asyncio.gather(*first, *late)
        await asyncio.sleep(0.03)
        cancelled.cancel()  # leaves mid-way: the others go on
        return await results

    results = asyncio.run(scenario())
    assert [tokens for tokens, _ in results] == alone
    assert all(layers[0]["batch"] >= 1 for _, layers in results)
    n_moe = len(model.spec.moe_layers)
    iterations = [it.batch for it in batcher.iterations]
    assert len(network.calls) == len(iterations) * n_moe  # one call per MoE layer per iteration
    assert max(iterations) >= 7 and len(iterations) < 8 * NEW_TOKENS / 3  # they really shared


def test_a_generation_alone_is_not_kept_waiting() -> None:
    calls = []

    async def drive(model_id, gen, options, ctx, work):
        calls.append(asyncio.get_running_loop().time())
        return [np.zeros((1, 4), dtype=np.float32)], [], 0.0

    class _Model:
        def run_batch(self, items, last_only):
            yield from ()
            return [np.zeros((1, 4), dtype=np.float32) for _ in items]

    batcher = StepBatcher(drive, lambda **kwargs: None, wait_s=10.0)

    async def scenario():
        seat = batcher.seat("m", _Model(), OPTIONS)
        started = asyncio.get_running_loop().time()
        for _ in range(3):
            await seat.step("m", None, np.array([1]), None, OPTIONS, None, ForwardWork())
        seat.leave()
        return asyncio.get_running_loop().time() - started

    assert asyncio.run(scenario()) < 1.0  # never the 10 s wait: everyone seated had asked
    assert [it.batch for it in batcher.iterations] == [1, 1, 1]


def test_an_iteration_carries_at_most_max_rows_and_the_rest_go_first_in_the_next(fixture) -> None:
    model = fixture.model
    network = _Network(fixture)
    batcher = StepBatcher(network.drive, lambda **kwargs: None, wait_s=0.05, max_rows=5)
    prompts = [[3, 4, 5], [6, 7, 8], [9]]

    async def scenario():
        return await asyncio.gather(*(_generate(batcher, model, p, 2) for p in prompts))

    results = asyncio.run(scenario())
    assert [tokens for tokens, _ in results] == [greedy_generate(model, p, 2, fixture.moe) for p in prompts]
    rows = [it.rows for it in batcher.iterations]
    assert max(rows) <= 5 and rows[0] == 3  # the first prefill alone: the second's 3 rows would pass 5
    view = batcher.view(window_s=10.0, shown=2)
    assert [it["rows"] for it in view["iterations"]] == rows[-2:]
    assert view["tokens_per_s"] == sum(it.batch for it in batcher.iterations) / 10.0


def test_sampled_generations_with_a_seed_draw_the_tokens_they_draw_alone(fixture) -> None:
    model = fixture.model
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, model.spec.vocab_size, size=int(rng.integers(1, 10))).tolist() for _ in range(6)]

    async def alone(prompt, seed):
        return await _generate(StepBatcher(_Network(fixture).drive, lambda **kwargs: None, wait_s=0.0), model, prompt,
                               NEW_TOKENS, seed=seed)

    async def together():
        batcher = StepBatcher(_Network(fixture).drive, lambda **kwargs: None, wait_s=0.05)
        results = await asyncio.gather(*(_generate(batcher, model, p, NEW_TOKENS, seed=100 + i)
                                         for i, p in enumerate(prompts)))
        return results, max(it.batch for it in batcher.iterations)

    expected = [asyncio.run(alone(p, 100 + i))[0] for i, p in enumerate(prompts)]
    results, largest = asyncio.run(together())
    assert [tokens for tokens, _ in results] == expected and largest == len(prompts)
