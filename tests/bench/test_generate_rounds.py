"""bench/generate.py's rounds: the order its timed runs take (pure; no node is started)."""

from collections import Counter
from itertools import pairwise

from bench.generate import rotations


def test_every_run_has_every_place_equally_often_over_whole_rotations() -> None:
    names = ["local", "q8_0", "f32"]
    rounds = rotations(names, 6)
    assert all(sorted(order) == sorted(names) for order in rounds)  # each run once a round
    places = Counter((place, name) for order in rounds for place, name in enumerate(order))
    assert set(places.values()) == {2}  # 6 rounds of 3: each run twice in each place
    assert rounds[0] == names  # the first round keeps the order given


def test_no_run_always_follows_the_same_one() -> None:
    after = Counter(pair for order in rotations(["local", "q8_0", "f32"], 3) for pair in pairwise(order))
    assert after[("q8_0", "f32")] < 3  # a fixed order had the f32 wire follow the q8_0 one every round
