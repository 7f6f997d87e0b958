"""A holder's request cut by token over connection lanes (apps/forward/lanes.py)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.forward.lanes import split_by_tokens


def _items(rng, n_tokens, n_batches, k):
    experts = np.stack([rng.permutation(n_batches)[:k] for _ in range(n_tokens)])
    pair_tokens = np.repeat(np.arange(n_tokens), k)
    pair_experts = experts.ravel()
    items = [(f"batch {b}", np.flatnonzero(pair_experts == b)) for b in range(n_batches)]
    return [(b, p) for b, p in items if len(p)], pair_tokens


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tokens=st.integers(1, 70), n_batches=st.integers(1, 9),
       lanes=st.integers(1, 20))
def test_every_pair_lands_in_one_part_with_all_of_its_tokens_pairs(seed, n_tokens, n_batches, lanes) -> None:
    rng = np.random.default_rng(seed)
    k = min(2, n_batches)
    items, pair_tokens = _items(rng, n_tokens, n_batches, k)
    parts = split_by_tokens(items, pair_tokens, lanes)
    assert 1 <= len(parts) <= min(lanes, n_tokens)
    every = np.sort(np.concatenate([pairs for part in parts for _, pairs in part]))
    np.testing.assert_array_equal(every, np.sort(np.concatenate([p for _, p in items])))  # each pair once
    token_sets = [set(pair_tokens[np.concatenate([p for _, p in part])].tolist()) for part in parts]
    assert sum(map(len, token_sets)) == len(set().union(*token_sets))  # a token in one part only
    order = [b for b, _ in items]
    for part in parts:
        assert all(len(pairs) for _, pairs in part)  # no empty batch
        assert [b for b, _ in part] == [b for b in order if b in {x for x, _ in part}]  # the batches' order
        for _, pairs in part:
            assert np.all(np.diff(pairs) > 0)  # each batch's pairs keep their order
    if len(parts) > 1:  # in token order, about even: a part's pairs differ from the even share by < a token's
        firsts = [min(s) for s in token_sets]
        assert firsts == sorted(firsts)
        sizes = [sum(len(p) for _, p in part) for part in parts]
        assert max(sizes) - min(sizes) <= 2 * k


def test_one_lane_or_one_token_keeps_the_request_whole() -> None:
    items = [("a", np.array([0, 1])), ("b", np.array([2]))]
    assert split_by_tokens(items, np.array([7, 7, 7]), 4) == [items]  # a single token cannot be cut
    assert split_by_tokens(items, np.array([1, 2, 3]), 1) == [items]
