"""The whole model against transformers: prompt logits, 16 greedy tokens, KV-cache decoding, the
sans-I/O protocol and its refusals. The MoE blocks run through the project's own prepare path and
ExpertRuntime.forward_local (tests/generation/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from apps.generation.model import WholeModel, greedy_generate
from apps.generation.weights import DenseWeights

# Relative L2 of the logits against transformers' f32 forward: both sides are f32, and they differ
# only in summation order (BLAS blocking, MLA's absorbed latent products, the expert combine), which
# costs 4-6e-7 (measured for every fixture); 1e-5 leaves room for other BLAS builds while any math
# error is far above it.
LOGITS_RTOL = 1e-5
# Prefill vs token-by-token decode of this very code: the same math on differently shaped matmuls.
CACHE_RTOL = 1e-5


def rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def test_prompt_logits_match_transformers(fixture):
    model = fixture.model
    prompt = np.array(fixture.expected["prompt_ids"])
    logits = model.forward(prompt, model.new_cache(), fixture.moe)
    assert logits.dtype == np.float32 and logits.shape == fixture.logits.shape
    err = rel(logits, fixture.logits)
    print(f"{fixture.name}: relative logit error {err:.2e}")
    assert err < LOGITS_RTOL
    assert (logits.argmax(axis=1) == fixture.logits.argmax(axis=1)).all()


def test_greedy_16_tokens_match_generate(fixture):
    ids = greedy_generate(fixture.model, fixture.expected["prompt_ids"], 16, fixture.moe)
    assert ids == fixture.expected["greedy_ids"]


def test_kv_cache_decode_equals_one_shot_forward(fixture):
    model = fixture.model
    seq = np.array(fixture.expected["prompt_ids"] + fixture.expected["greedy_ids"])
    one_shot = model.forward(seq, model.new_cache(), fixture.moe)  # (24, vocab)
    # prefill 5, then a chunk of 3, then one token at a time: every position's logits as in one shot
    cache = model.new_cache()
    parts = [model.forward(seq[:5], cache, fixture.moe), model.forward(seq[5:8], cache, fixture.moe)]
    parts += [model.forward(seq[i:i + 1], cache, fixture.moe) for i in range(8, len(seq))]
    stepped = np.concatenate(parts)
    assert cache.length == len(seq) and cache.nbytes > 0
    assert rel(stepped, one_shot) < CACHE_RTOL
    assert (stepped.argmax(axis=1) == one_shot.argmax(axis=1)).all()


def test_last_only_is_the_last_row(fixture):
    model = fixture.model
    prompt = np.array(fixture.expected["prompt_ids"])
    full = model.forward(prompt, model.new_cache(), fixture.moe)
    last = model.forward(prompt, model.new_cache(), fixture.moe, last_only=True)
    assert last.shape == (1, model.spec.vocab_size)
    np.testing.assert_allclose(last[0], full[-1], rtol=1e-6, atol=1e-6)
    rows = []  # the last layer's MoE gets only the last row (its keys and values are cached already)

    def moe(layer, x):
        rows.append((layer, len(x)))
        return fixture.moe(layer, x)

    cache = model.new_cache()
    model.forward(prompt, cache, moe, last_only=True)
    last_layer = model.spec.n_layers - 1
    assert rows == [(layer, 1 if layer == last_layer else len(prompt)) for layer in model.spec.moe_layers]
    assert cache.length == len(prompt)
    np.testing.assert_allclose(model.forward(np.array([7]), cache, fixture.moe, last_only=True)[0],
                               model.forward(np.r_[prompt, 7], model.new_cache(), fixture.moe)[-1],
                               rtol=1e-5, atol=1e-5)


def test_run_yields_each_moe_layer_and_commits_the_cache_on_return(fixture):
    model, spec = fixture.model, fixture.model.spec
    cache = model.new_cache()
    steps = model.run(np.array([3, 4, 5]), cache)
    seen = []
    try:
        layer, x = next(steps)
        while True:
            seen.append(layer)
            assert x.dtype == np.float32 and x.shape == (3, spec.d_model) and x.flags.c_contiguous
            assert cache.length == 0  # nothing appended while the step is in flight
            layer, x = steps.send(fixture.runtime.forward_local(model_id=fixture.name, layer=layer, hidden=x))
    except StopIteration as done:
        logits = done.value
    assert seen == list(spec.moe_layers) and all(spec.is_moe(i) for i in seen)
    assert logits.shape == (3, spec.vocab_size) and cache.length == 3


def test_abandoned_or_failed_step_leaves_the_cache_unchanged(fixture):
    model = fixture.model
    cache = model.new_cache()
    model.forward(np.array([7, 8]), cache, fixture.moe)
    before = cache.length
    steps = model.run(np.array([9]), cache)
    next(steps)
    steps.close()  # the caller gave up (a peer failed): the generator is dropped mid-layer
    assert cache.length == before

    def failing(layer, x):
        raise RuntimeError("peer gone")

    with pytest.raises(RuntimeError, match="peer gone"):
        model.forward(np.array([9]), cache, failing)
    assert cache.length == before
    # and the cache still decodes correctly afterwards
    ref = model.forward(np.array([7, 8, 9]), model.new_cache(), fixture.moe)
    got = model.forward(np.array([9]), cache, fixture.moe)
    assert rel(got[0], ref[-1]) < CACHE_RTOL


@pytest.mark.parametrize(("ids", "match"), [
    ([], "non-empty"),
    ([[1, 2]], "1-D"),
    ([1.0, 2.0], "integers"),
    ([0, 256], "token id 256 out of range 0..255"),
    ([-1], "token id -1 out of range"),
])
def test_bad_token_ids_are_refused(fixture, ids, match):
    model = fixture.model
    with pytest.raises(ValueError, match=match):
        model.forward(np.array(ids), model.new_cache(), fixture.moe)


@pytest.mark.parametrize(("bad", "match"), [
    (lambda x: x[:, :-1], r"MoE output of layer \d+ has shape"),
    (lambda x: np.full_like(x, np.nan), r"MoE output of layer \d+ holds \d+ NaN/inf"),
    (lambda x: "nope", "must be a float array"),
])
def test_bad_moe_output_is_refused(fixture, bad, match):
    model = fixture.model
    cache = model.new_cache()
    with pytest.raises(ValueError, match=match):
        model.forward(np.array([1, 2]), cache, lambda layer, x: bad(x))
    assert cache.length == 0


def test_cache_of_another_model_and_bad_generation_arguments(fixture):
    model = fixture.model
    with pytest.raises(ValueError, match="new_cache"):
        model.forward(np.array([1]), object(), fixture.moe)
    with pytest.raises(ValueError, match="non-empty"):
        greedy_generate(model, [], 4, fixture.moe)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_generate(model, [1], -1, fixture.moe)
    assert greedy_generate(model, [1], 0, fixture.moe) == []


def test_whole_model_refuses_weights_that_do_not_fit_its_spec(fixture):
    weights = DenseWeights(spec=fixture.model.spec, tensors={})
    with pytest.raises(ValueError, match="missing"):
        WholeModel(weights)
