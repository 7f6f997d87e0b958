"""Sequences stepped together (apps/generation/lockstep.py): one MoE call per layer for all their rows,
each sequence's tokens exactly those it gets alone, joining and leaving between steps."""

from __future__ import annotations

import numpy as np
import pytest

from apps.generation.lockstep import LockstepError, lockstep
from apps.generation.model import drive as _drive
from apps.generation.model import greedy_generate

NEW_TOKENS = 8


def _prompts(fixture, n: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    vocab = fixture.model.spec.vocab_size
    return [fixture.expected["prompt_ids"]] + [rng.integers(3, vocab, size=int(rng.integers(1, 12))).tolist()
                                               for _ in range(n - 1)]


def test_eight_sequences_in_lockstep_give_the_tokens_each_gives_alone(fixture) -> None:
    model = fixture.model
    prompts = _prompts(fixture, 8)
    alone = [greedy_generate(model, p, NEW_TOKENS, fixture.moe) for p in prompts]
    # Sequences join between steps (the i-th after i steps: its prefill beside the others' decodes) and
    # leave once they have their tokens.
    caches = [model.new_cache() for _ in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]
    calls = []

    def moe(layer, x):
        calls.append((layer, len(x)))
        return fixture.moe(layer, x)

    step = 0
    while any(len(t) < NEW_TOKENS for t in tokens):
        active = [i for i in range(len(prompts)) if i <= step and len(tokens[i]) < NEW_TOKENS]
        runs = [model.run(np.array(tokens[i][-1:] or prompts[i]), caches[i], last_only=True) for i in active]
        for i, logits in zip(active, _drive(lockstep(runs), moe), strict=True):
            tokens[i].append(int(np.argmax(logits[-1])))
        step += 1
    assert tokens == alone
    n_moe = len(model.spec.moe_layers)
    assert len(calls) == step * n_moe  # one MoE call per layer per step, whatever the batch
    assert max(rows for _, rows in calls) > 8  # prefills beside decodes in one call


def test_a_batch_abandoned_or_failed_mid_step_leaves_every_cache_as_it_was(fixture) -> None:
    model = fixture.model
    prompts = _prompts(fixture, 3)
    caches = [model.new_cache() for _ in prompts]
    for p, cache in zip(prompts, caches, strict=True):
        model.forward(np.array(p), cache, fixture.moe)
    before = [c.length for c in caches]
    batch = lockstep([model.run(np.array([5]), c, last_only=True) for c in caches])
    next(batch)
    batch.close()  # the forward failed: the step is dropped
    assert [c.length for c in caches] == before
    batch = lockstep([model.run(np.array([5]), c, last_only=True) for c in caches])
    layer, x = next(batch)
    with pytest.raises(LockstepError, match="3 rows"):
        batch.send(fixture.moe(layer, x)[:2])  # a row short
    assert [c.length for c in caches] == before
    # and each still decodes as if nothing happened
    ref = [model.forward(np.array([*p, 5]), model.new_cache(), fixture.moe)[-1] for p in prompts]
    got = _drive(lockstep([model.run(np.array([5]), c, last_only=True) for c in caches]), fixture.moe)
    for r, g in zip(ref, got, strict=True):
        np.testing.assert_allclose(g[0], r, rtol=1e-5, atol=1e-5)


def test_no_runs_is_an_empty_step() -> None:
    assert _drive(lockstep([]), lambda layer, x: x) == []
