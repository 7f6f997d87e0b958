"""Routings in: what the planner refuses, and that every refusal names the entry or the token."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import InvalidInput
from core.shardmap.index import ShardIndex
from core.shardmap.planner import PlanInputError, plan_dispatch, plan_pairs
from core.shardmap.routings import parse_routings
from testkit.shard_views import MODEL, POLICY, holding, provider

SHARD = ShardIndex.build(MODEL, [provider(1)], [holding(1, 0, 0)], POLICY)


def ok(token=0, *pairs):
    return {"token_index": token, "experts": [{"layer": layer, "expert": e} for layer, e in pairs]}


@pytest.mark.parametrize(("routings", "match"), [
    ({"token_index": 0}, "routings must be a list"),
    ([ok(0, (0, 0)), 7], r"routings\[1\] must be an object"),
    ([{"experts": []}], r"routings\[0\] has no token_index"),
    ([{"token_index": -1, "experts": []}], r"routings\[0\].token_index must be an integer"),
    ([{"token_index": True, "experts": []}], r"got True"),
    ([{"token_index": 3.0, "experts": []}], r"got 3.0"),
    ([{"token_index": 2**31, "experts": []}], r"token_index must be an integer in \[0, 2\*\*31\)"),
    ([{"token_index": 2**70, "experts": []}], r"token_index must be an integer"),  # past int64 too
    ([ok(1, (2**64, 0))], r"token 1 \(routings\[0\]\) experts\[0\].layer must be an integer"),
    ([{"token_index": 4, "experts": {"layer": 0}}], r"token 4 \(routings\[0\]\): experts must be a list"),
    ([{"token_index": 4}], r"token 4 \(routings\[0\]\): experts must be a list"),
    ([ok(1, (0, 0)), {"token_index": 4, "experts": [{"layer": 0}]}],
     r"token 4 \(routings\[1\]\) experts\[0\] has no expert"),
    ([{"token_index": 4, "experts": [[0, 1]]}], r"token 4 .* experts\[0\] must be an object"),
    ([{"token_index": 4, "experts": [{"layer": "0", "expert": 1}]}], r"experts\[0\].layer must be an integer"),
    ([{"token_index": 4, "experts": [{"layer": 0, "expert": -2}]}], r"experts\[0\].expert must be an integer"),
    ([{"token_index": 4, "experts": [{"layer": 0, "expert": False}]}], r"got False"),
    ([ok(5, (0, 0)), ok(5, (0, 1))], r"token_index 5 appears in more than one routing entry"),
    ([ok(1, (0, 0)), ok(5, (0, 1), (0, 0), (0, 1))], r"token 5 routes to layer 0 expert 1 twice"),
    ([ok(5, (7, 9), (7, 9))], r"token 5 routes to layer 7 expert 9 twice"),  # an expert nobody holds, too
])
def test_malformed_routings_are_refused_with_a_message_naming_them(routings, match):
    with pytest.raises(PlanInputError, match=match) as caught:
        plan_dispatch(routings, SHARD)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, InvalidInput)
    assert caught.value.reason == "invalid_input"


def test_parse_orders_tokens_and_keeps_each_tokens_expert_order():
    tokens, layers, experts, listed = parse_routings([ok(9, (1, 4), (0, 2)), ok(2, (0, 7)), ok(5)])
    assert tokens.tolist() == [2, 9, 9] and layers.tolist() == [0, 1, 0] and experts.tolist() == [7, 4, 2]
    assert listed.tolist() == [2, 5, 9]
    assert parse_routings(({"token_index": 0, "experts": (), "extra": "ignored"},))[3].tolist() == [0]


@pytest.mark.parametrize(("columns", "match"), [
    (([0, 1], [0], [0]), "differ in length"),
    (([0.5], [0], [0]), "token_index must be a 1-D integer array"),
    (([[0]], [[0]], [[0]]), "1-D"),
    (([0], [-1], [0]), r"layer values must lie in \[0, 2\*\*31\)"),
    (([0], [0], [2**31]), "expert values"),
    (([3, 3], [0, 0], [0, 0]), "token 3 routes to layer 0 expert 0 twice"),
    (([3, 1, 3], [0, 0, 0], [1, 0, 1]), "token 3 routes to layer 0 expert 1 twice"),  # unsorted tokens: general path
])
def test_malformed_pair_arrays_are_refused(columns, match):
    with pytest.raises(PlanInputError, match=match):
        plan_pairs(*(np.asarray(c) for c in columns), SHARD)


def test_min_batch_rows_must_be_positive():
    with pytest.raises(PlanInputError, match="min_batch_rows"):
        plan_dispatch([ok(0, (0, 0))], SHARD, min_batch_rows=0)
