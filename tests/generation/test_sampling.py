"""Sampling: the greedy path unchanged, seeds that repeat, draws that follow the filtered softmax."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apps.generation.sampling import Sampler, SamplingError, SamplingParams, kept_distribution

VOCAB = 50


def logits(seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(VOCAB) * 2.0).astype(np.float32)


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2) (series)."""
    a, z = df / 2.0, x / 2.0
    term = total = 1.0 / a
    n = 1
    while term > total * 1e-15:
        term *= z / (a + n)
        total += term
        n += 1
    return max(0.0, 1.0 - math.exp(a * math.log(z) - z - math.lgamma(a)) * total)


def test_temperature_zero_is_argmax_bit_for_bit() -> None:
    x = logits()
    x[7] = x[9] = x.max() + 1.0  # a tie goes to the lower id, as torch.argmax
    sampler = Sampler(SamplingParams(temperature=0.0), [1, 2])
    assert [sampler.choose(x).token for _ in range(3)] == [7, 7, 7]


def test_the_same_seed_gives_the_same_tokens_and_another_seed_others() -> None:
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    runs = [[Sampler(params, [3]).choose(logits(i)).token for i in range(40)] for _ in range(2)]
    assert runs[0] == runs[1]
    other = [Sampler(SamplingParams(temperature=1.0, top_p=0.9, seed=99), [3]).choose(logits(i)).token
             for i in range(40)]
    assert other != runs[0]
    fresh = Sampler(SamplingParams(temperature=1.0), [3])
    assert fresh.seed is not None and 0 <= fresh.seed < 2**63  # drawn, and reported so it can be repeated


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=10),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=20, top_p=0.9, min_p=0.05),
])
def test_draws_follow_the_filtered_softmax(params: SamplingParams) -> None:
    """2,000 draws at one step against softmax(logits / T) after top-k, top-p and min-p (chi-square)."""
    x = logits(5)
    z = x.astype(np.float64) / params.temperature
    order = np.argsort(-z, kind="stable")
    p = np.exp(z[order] - z[order][0])
    p /= p.sum()
    keep = np.ones(VOCAB, dtype=bool)
    if params.top_k:
        keep[params.top_k:] = False
    q = np.where(keep, p, 0.0)
    q /= q.sum()
    if params.top_p < 1.0:
        crossing = int(np.argmax(np.cumsum(q) >= params.top_p))
        keep[crossing + 1:] = False
        q = np.where(keep, q, 0.0)
        q /= q.sum()
    if params.min_p:
        keep &= q >= params.min_p * q[0]
        q = np.where(keep, q, 0.0)
    expected = dict(zip(order[keep].tolist(), (q[keep] / q[keep].sum()).tolist(), strict=True))
    _probs, ids = kept_distribution(x, params)
    assert set(ids.tolist()) == set(expected)
    draws = 2000
    sampler = Sampler(SamplingParams(**{**params.__dict__, "seed": 42}), [])
    counts: dict[int, int] = {}
    for _ in range(draws):
        token = sampler._draw(x)  # one step's draw, again and again (choose() would also apply penalties)
        counts[token] = counts.get(token, 0) + 1
    assert set(counts) <= set(expected)  # nothing filtered out is ever drawn
    # pool the rare tokens so each cell expects at least 5 draws
    cells, pooled_o, pooled_e = [], 0.0, 0.0
    for token, prob in sorted(expected.items(), key=lambda kv: -kv[1]):
        if prob * draws >= 5:
            cells.append((counts.get(token, 0), prob * draws))
        else:
            pooled_o, pooled_e = pooled_o + counts.get(token, 0), pooled_e + prob * draws
    if pooled_e:
        cells.append((pooled_o, pooled_e))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    assert chi2_sf(stat, len(cells) - 1) > 0.001, (stat, cells)


def test_penalties_move_the_greedy_choice() -> None:
    x = np.zeros(VOCAB, dtype=np.float32)
    x[3], x[4] = 2.0, 1.9
    repeat = Sampler(SamplingParams(temperature=0.0, repetition_penalty=1.2), prompt_ids=[3])
    assert repeat.choose(x).token == 4  # 2.0 / 1.2 < 1.9
    presence = Sampler(SamplingParams(temperature=0.0, presence_penalty=0.5), prompt_ids=[])
    assert [presence.choose(x).token for _ in range(2)] == [3, 4]  # 3 was said once: 1.5 < 1.9
    assert np.array_equal(x[:5], np.array([0, 0, 0, 2.0, 1.9], dtype=np.float32))  # the step's logits are not modified


def test_logprobs_are_the_models_own() -> None:
    x = logits(3)
    choice = Sampler(SamplingParams(temperature=0.0, top_logprobs=3), []).choose(x)
    z = x.astype(np.float64) - x.max()
    logp = z - np.log(np.exp(z).sum())
    assert choice.token == int(np.argmax(x)) and choice.logprob == pytest.approx(logp[choice.token])
    assert [t for t, _ in choice.top] == np.argsort(-logp)[:3].tolist()


@pytest.mark.parametrize("field, value", [("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0),
                                          ("top_p", 1.5), ("top_k", -1), ("min_p", 2.0), ("seed", -1),
                                          ("repetition_penalty", 0.0), ("frequency_penalty", 3.0),
                                          ("top_logprobs", 21), ("temperature", "hot")])
def test_out_of_range_parameters_are_named(field: str, value: object) -> None:
    with pytest.raises(SamplingError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field and field in str(err.value)
