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
       windows=st.lists(st.integers(0, 200_000), min_size=1, max_size=20))
def test_the_parts_are_runs_of_the_pairs_in_batch_order_in_proportion_to_the_windows(seed, n_tokens, n_batches,
                                                                                      windows) -> None:
    rng = np.random.default_rng(seed)
    items = _items(rng, n_tokens, n_batches, min(2, n_batches))
    total = sum(len(p) for _, p in items)
    parts = split_in_expert_order(items, windows)
    assert len(parts) == max(1, min(len(windows), total))
    runs = [(batch, pairs) for part in parts for batch, pairs in part]
    flat = np.concatenate([pairs for _, pairs in runs])
    np.testing.assert_array_equal(flat, np.concatenate([p for _, p in items]))  # each pair once, in batch order
    assert [b for b, _ in items] == list(dict.fromkeys(b for b, _ in runs))  # a batch's pieces are adjacent
    sizes = [sum(len(p) for _, p in part) for part in parts]
    assert min(sizes) >= 1
    if len(parts) > 1 and all(windows[:len(parts)]) and total >= 4 * len(parts):
        # in proportion to the windows, within a pair, and a pair more for each part raised to one pair
        shares = np.array(windows[:len(parts)], dtype=float)
        ideal = total * shares / shares.sum()
        assert np.all(np.abs(np.array(sizes) - ideal) <= 1 + np.count_nonzero(ideal < 1)), (sizes, ideal)
    assert all(len(pairs) for _, pairs in runs)  # no empty batch in a part
    # the holder reads each expert's weights once, plus once more per cut
    assert len(runs) <= len(items) + len(parts) - 1


def test_one_lane_or_one_pair_keeps_the_request_whole() -> None:
    items = [("a", np.array([0, 1])), ("b", np.array([2]))]
    assert split_in_expert_order(items, [30_000]) == [items]
    assert split_in_expert_order([("a", np.array([4]))], [1, 1, 1, 1]) == [[("a", np.array([4]))]]


def _shapes(parts):
    return [[(b, p.tolist()) for b, p in part] for part in parts]


def test_a_batch_larger_than_a_part_is_cut_between_parts() -> None:
    items = [("a", np.arange(6)), ("b", np.arange(6, 8))]
    assert _shapes(split_in_expert_order(items, [5, 5])) == [[("a", [0, 1, 2, 3])], [("a", [4, 5]), ("b", [6, 7])]]


def test_a_lane_with_a_small_window_gets_a_small_part_and_an_unknown_one_the_mean() -> None:
    items = [("a", np.arange(40))]
    sizes = [sum(len(p) for _, p in part) for part in split_in_expert_order(items, [300_000, 15_000, 15_000, 0])]
    # a lane opened a moment ago (its initial window) beside a warm one; the unknown counts as 110,000
    assert sizes == [27, 2, 1, 10]  # bounds rounded from the running sums: 27.3, 28.6, 30
