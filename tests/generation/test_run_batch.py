"""Sequences stepped together (WholeModel.run_batch): one matrix product per projection and one MoE call
per layer for all their rows, each sequence's tokens exactly those it gets alone, joining and leaving
between steps."""

from __future__ import annotations

import numpy as np
import pytest

from apps.generation.model import drive as _drive
from apps.generation.model import greedy_generate

NEW_TOKENS = 8


def _prompts(fixture, n: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    vocab = fixture.model.spec.vocab_size
    return [fixture.expected["prompt_ids"]] + [rng.integers(3, vocab, size=int(rng.integers(1, 12))).tolist()
                                               for _ in range(n - 1)]


def test_eight_sequences_stepped_together_give_the_tokens_each_gives_alone(fixture) -> None:
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
        batch = model.run_batch([(np.array(tokens[i][-1:] or prompts[i]), caches[i]) for i in active], last_only=True)
        for i, logits in zip(active, _drive(batch, moe), strict=True):
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
    batch = model.run_batch([(np.array([5]), c) for c in caches], last_only=True)
    next(batch)
    batch.close()  # the forward failed: the step is dropped
    assert [c.length for c in caches] == before
    batch = model.run_batch([(np.array([5]), c) for c in caches], last_only=True)
    layer, x = next(batch)
    with pytest.raises(ValueError, match=r"shape \(2, \d+\), expected \(3, "):
        batch.send(fixture.moe(layer, x)[:2])  # a row short
    assert [c.length for c in caches] == before
    # and each still decodes as if nothing happened
    ref = [model.forward(np.array([*p, 5]), model.new_cache(), fixture.moe)[-1] for p in prompts]
    got = _drive(model.run_batch([(np.array([5]), c) for c in caches], last_only=True), fixture.moe)
    for r, g in zip(ref, got, strict=True):
        np.testing.assert_allclose(g[0], r, rtol=1e-5, atol=1e-5)


def test_a_full_forward_of_several_sequences_gives_each_its_logits_at_every_position(fixture) -> None:
    model = fixture.model
    prompts = _prompts(fixture, 4)
    got = _drive(model.run_batch([(np.array(p), model.new_cache()) for p in prompts]), fixture.moe)
    for p, g in zip(prompts, got, strict=True):
        assert g.shape == (len(p), model.spec.vocab_size)
        np.testing.assert_allclose(g, model.forward(np.array(p), model.new_cache(), fixture.moe), rtol=1e-4, atol=1e-4)


def test_a_batch_refuses_one_cache_twice_and_an_empty_batch_is_an_empty_step(fixture) -> None:
    model = fixture.model
    cache = model.new_cache()
    with pytest.raises(ValueError, match="same cache was given twice"):
        next(model.run_batch([(np.array([5]), cache), (np.array([6]), cache)]))
    assert cache.length == 0
    assert _drive(model.run_batch([]), lambda layer, x: x) == []
