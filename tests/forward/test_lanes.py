"""A holder's request cut in expert order over connection lanes (apps/forward/lanes.py)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.forward.lanes import split_in_expert_order


def _items(rng, n_tokens, n_batches, k):
    experts = np.stack([rng.permutation(n_batches)[:k] for _ in range(n_tokens)])
    pair_experts = experts.ravel()
    items = [(f"batch {b}", np.flatnonzero(pair_experts == b)) for b in range(n_batches)]
    return [(b, p) for b, p in items if len(p)]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tokens=st.integers(1, 70), n_batches=st.integers(1, 9),
       lanes=st.integers(1, 20))
def test_the_parts_are_even_runs_of_the_pairs_in_batch_order(seed, n_tokens, n_batches, lanes) -> None:
    rng = np.random.default_rng(seed)
    items = _items(rng, n_tokens, n_batches, min(2, n_batches))
    total = sum(len(p) for _, p in items)
    parts = split_in_expert_order(items, lanes)
    assert len(parts) == max(1, min(lanes, total))
    runs = [(batch, pairs) for part in parts for batch, pairs in part]
    flat = np.concatenate([pairs for _, pairs in runs])
    np.testing.assert_array_equal(flat, np.concatenate([p for _, p in items]))  # each pair once, in batch order
    assert [b for b, _ in items] == list(dict.fromkeys(b for b, _ in runs))  # a batch's pieces are adjacent
    sizes = [sum(len(p) for _, p in part) for part in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert all(len(pairs) for _, pairs in runs)  # no empty batch in a part
    # the holder reads each expert's weights once, plus once more per cut
    assert len(runs) <= len(items) + len(parts) - 1


def test_one_lane_or_one_pair_keeps_the_request_whole() -> None:
    items = [("a", np.array([0, 1])), ("b", np.array([2]))]
    assert split_in_expert_order(items, 1) == [items]
    assert split_in_expert_order([("a", np.array([4]))], 4) == [[("a", np.array([4]))]]


def test_a_batch_larger_than_a_part_is_cut_between_parts() -> None:
    items = [("a", np.arange(6)), ("b", np.arange(6, 8))]
    parts = split_in_expert_order(items, 2)
    assert [[(b, p.tolist()) for b, p in part] for part in parts] == [[("a", [0, 1, 2, 3])],
                                                                     [("a", [4, 5]), ("b", [6, 7])]]
