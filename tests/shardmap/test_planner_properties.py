"""Dispatch planner properties over random small views (hypothesis).

Every routed (token, layer, expert) pair is served exactly once or reported unroutable with
the right reason; Warm beats Cold; Cold only with allow_cold; backups never name the
primary or an excluded provider; the plan depends on the view, not on the order it came in.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.shardmap import planner, spread
from core.shardmap.gossip_view import ReplicationPolicy
from core.shardmap.index import ShardIndex
from core.shardmap.planner import plan_dispatch, plan_pairs
from core.shardmap.routings import PlanInputError
from testkit.shard_views import MODEL, holding, provider, provider_id

EXPERTS = [(layer, expert) for layer in range(2) for expert in range(4)]
NOBODYS = (2, 0)  # routed to, never held


@st.composite
def scenarios(draw):
    n_providers = draw(st.integers(1, 6))
    providers = [provider(i, gpu=draw(st.booleans()), latency_ms=draw(st.sampled_from([None, 0.0, 5.0, 40.0])))
                 for i in range(n_providers)]
    holdings = []
    for layer, expert in EXPERTS:
        # Provider n_providers is not in the view: its holdings must be ignored (the view lags).
        # Expert (0, 0), the one every token may share, has two holders or more where there are two.
        least = min(2, n_providers) if (layer, expert) == (0, 0) else 1
        for p in draw(st.lists(st.integers(0, n_providers), unique=True, min_size=least, max_size=n_providers + 1)):
            holdings.append(holding(p, layer, expert, warm=draw(st.sampled_from([True, True, False])),
                                    tps=draw(st.sampled_from([0, 100, 400, 400, 1200]))))
    # Tokens and per-token expert lists from a seeded Random: hypothesis' own lists stay short, and
    # routings need many pairs per expert before load spreading and splits come into play.
    pick = draw(st.randoms(use_true_random=False))
    tokens = pick.sample(range(300), draw(st.sampled_from([64, 40, 16, 5, 2, 1])))
    most = draw(st.sampled_from([5, 3, 1, 0]))  # first values come most often
    shared = draw(st.booleans())  # every token also routes to expert (0, 0), like a shared expert: splits it
    routings = []
    for t in tokens:
        chosen = pick.sample([*EXPERTS, NOBODYS], pick.randint(0, most))
        if shared and (0, 0) not in chosen:
            chosen.append((0, 0))
        routings.append({"token_index": t, "experts": [{"layer": layer, "expert": expert} for layer, expert in chosen]})
    policy = ReplicationPolicy(min_replication=2, max_replication=8,
                               hot_threshold_tps=draw(st.sampled_from([0, 500, 1000, 10**9])))
    options = {"allow_cold": draw(st.booleans()),
               "exclude": {provider_id(i) for i in draw(st.sets(st.integers(0, n_providers + 1), max_size=2))},
               "min_batch_rows": draw(st.sampled_from([1, 2, 4, 32]))}
    return providers, holdings, policy, routings, options, draw(st.randoms(use_true_random=False))


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def holders_of(providers, holdings):
    """(layer, expert) -> {provider id: warm?} over the providers in the view."""
    known = {p.provider_id for p in providers}
    out: dict[tuple[int, int], dict[str, bool]] = {}
    for h in holdings:
        if h.provider_id in known and h.model_id == MODEL:
            slot = out.setdefault((h.layer, h.expert), {})
            slot[h.provider_id] = slot.get(h.provider_id, False) or h.residency == "Warm"
    return out


@SETTINGS
@given(scenarios())
def test_every_pair_is_served_once_or_reported(scenario):
    providers, holdings, policy, routings, options, _ = scenario
    plan = plan_dispatch(routings, ShardIndex.build(MODEL, providers, holdings, policy), **options)
    routed = {(r["token_index"], e["layer"], e["expert"]) for r in routings for e in r["experts"]}

    in_batches = Counter()
    batch_provider = {}
    for b in plan["batches"]:
        assert b["token_indices"] == sorted(b["token_indices"])
        for t in b["token_indices"]:
            in_batches[(t, b["layer"], b["expert"])] += 1
            batch_provider[(t, b["layer"], b["expert"])] = b["provider"]
    in_slots = {}
    for entry in plan["token_assignments"]:
        for slot in entry["slots"]:
            key = (entry["token_index"], slot["layer"], slot["expert"])
            assert key not in in_slots
            in_slots[key] = slot["provider"]
    unroutable = Counter((u["token_index"], u["layer"], u["expert"]) for u in plan["unroutable"])

    assert all(n == 1 for n in in_batches.values()) and all(n == 1 for n in unroutable.values())
    assert set(in_batches).isdisjoint(unroutable)
    assert set(in_batches) | set(unroutable) == routed
    assert in_slots == batch_provider  # a token's slots name the batch that serves it
    assert [e["token_index"] for e in plan["token_assignments"]] == sorted(r["token_index"] for r in routings)
    keys = [(b["layer"], b["expert"], b["provider"]) for b in plan["batches"]]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert plan["unroutable"] == sorted(plan["unroutable"], key=lambda u: (u["token_index"], u["layer"], u["expert"]))


@SETTINGS
@given(scenarios())
def test_tiers_reasons_and_backups(scenario):
    providers, holdings, policy, routings, options, _ = scenario
    plan = plan_dispatch(routings, ShardIndex.build(MODEL, providers, holdings, policy), **options)
    holders = holders_of(providers, holdings)
    excluded = options["exclude"]

    def usable(layer, expert):
        return {p: warm for p, warm in holders.get((layer, expert), {}).items() if p not in excluded}

    for b in plan["batches"]:
        can = usable(b["layer"], b["expert"])
        assert b["provider"] in can
        if any(can.values()) or not options["allow_cold"]:
            assert can[b["provider"]], "a Cold holder was chosen while a Warm one was usable (or without allow_cold)"
        backups = b["backups"]
        assert b["provider"] not in backups and not excluded & set(backups) and len(set(backups)) == len(backups)
        assert set(backups) <= set(can)
        warmth = [can[p] for p in backups]
        assert warmth == sorted(warmth, reverse=True), "backups are Warm first"
        if not options["allow_cold"]:
            assert all(warmth)
        else:  # every other usable holder is offered as a backup
            assert set(backups) == set(can) - {b["provider"]}

    for u in plan["unroutable"]:
        all_holders, can = holders.get((u["layer"], u["expert"]), {}), usable(u["layer"], u["expert"])
        expected = ("no_holder" if not all_holders else "holders_excluded" if not can
                    else "only_cold_holders")
        assert u["reason"] == expected
        if expected == "only_cold_holders":
            assert not any(can.values()) and not options["allow_cold"]


@SETTINGS
@given(scenarios())
def test_a_hot_expert_placed_whole_goes_to_a_gpu_holder_when_one_is_usable(scenario):
    providers, holdings, policy, routings, options, _ = scenario
    index = ShardIndex.build(MODEL, providers, holdings, policy)
    plan = plan_dispatch(routings, index, **options)
    gpu = {p.provider_id for p in providers if p.moe_gpu}
    holders = holders_of(providers, holdings)
    by_expert: dict[tuple[int, int], list[str]] = {}
    for b in plan["batches"]:
        by_expert.setdefault((b["layer"], b["expert"]), []).append(b["provider"])
    hot = {(int(layer), int(expert)) for layer, expert, h in
           zip(index.layers.tolist(), index.experts.tolist(), index.hot.tolist(), strict=True) if h}
    for key, chosen in by_expert.items():
        can = {p: w for p, w in holders[key].items() if p not in options["exclude"]}
        tier = {p for p, w in can.items() if w} or set(can)
        if key in hot and tier & gpu and len(chosen) == 1:  # placed whole: on a GPU holder (a split may not be)
            assert chosen[0] in gpu


@SETTINGS
@given(scenarios())
def test_deterministic_and_independent_of_input_order(scenario):
    providers, holdings, policy, routings, options, rnd = scenario
    first = plan_dispatch(routings, ShardIndex.build(MODEL, providers, holdings, policy), **options)
    assert plan_dispatch(routings, ShardIndex.build(MODEL, providers, holdings, policy), **options) == first
    providers, holdings, routings = list(providers), list(holdings), list(routings)
    rnd.shuffle(providers)
    rnd.shuffle(holdings)
    rnd.shuffle(routings)
    assert plan_dispatch(routings, ShardIndex.build(MODEL, providers, holdings, policy), **options) == first


@SETTINGS
@given(scenarios())
def test_pair_arrays_plan_like_json(scenario):
    providers, holdings, policy, routings, options, rnd = scenario
    index = ShardIndex.build(MODEL, providers, holdings, policy)
    pairs = [(r["token_index"], e["layer"], e["expert"]) for r in routings for e in r["experts"]]
    listed = sorted(r["token_index"] for r in routings)
    # Pairs in any order (the general sort path): each token's slots keep the token's own order.
    by_token = {}
    for t, layer, expert in pairs:
        by_token.setdefault(t, []).append((t, layer, expert))
    order = list(by_token)
    rnd.shuffle(order)
    shuffled = [p for t in order for p in by_token[t]]
    columns = [[p[i] for p in shuffled] for i in range(3)] if shuffled else [[], [], []]
    plan = plan_pairs(*columns, index, listed=listed, **options)
    assert plan.to_dict() == plan_dispatch(routings, index, **options)



@SETTINGS
@given(scenarios())
def test_backups_ranked_over_lists_are_those_ranked_over_arrays(scenario):
    """A plan of few pieces (a decode step's) ranks backups over lists (spread.RankedLater); any plan
    ranks them the same whichever way it takes."""
    providers, holdings, policy, routings, options, _ = scenario
    index = ShardIndex.build(MODEL, providers, holdings, policy)
    saved, plans = spread.FEW_PIECES, []
    try:
        for few in (0, 10**9):  # every plan over arrays, then every plan over lists
            spread.FEW_PIECES = few
            plans.append(plan_dispatch(routings, index, **options))
    finally:
        spread.FEW_PIECES = saved
    assert plans[0] == plans[1]


@SETTINGS
@given(scenarios())
def test_a_few_pairs_are_ordered_over_lists_as_many_are_over_arrays(scenario):
    """A plan of at most FEW_PAIRS pairs (a decode step's) finds its segments over lists; any plan is the
    same whichever way it takes, for pairs in token order and shuffled."""
    providers, holdings, policy, routings, options, rnd = scenario
    index = ShardIndex.build(MODEL, providers, holdings, policy)
    columns = _pair_columns(routings)
    pairs = list(zip(*columns, strict=True))
    rnd.shuffle(pairs)
    shuffled = [list(c) for c in zip(*pairs, strict=True)] if pairs else [[], [], []]
    saved = planner.FEW_PAIRS
    try:
        for cols in (columns, shuffled):
            plans = []
            for few in (0, 10**9):  # every plan over arrays, then every plan over lists
                planner.FEW_PAIRS = few
                plans.append(plan_pairs(*cols, index, **options))
            assert plans[0].to_dict() == plans[1].to_dict()
            assert plans[0].pair_batch.tolist() == plans[1].pair_batch.tolist()
            assert [b.token_indices.tolist() for b in plans[0].batches] == \
                [b.token_indices.tolist() for b in plans[1].batches]
    finally:
        planner.FEW_PAIRS = saved


def test_a_token_routed_twice_is_refused_alike_over_lists_and_arrays():
    index = ShardIndex.build(MODEL, [provider(0)], [holding(0, 0, 1)], ReplicationPolicy(2, 8, 10**9))
    messages, saved = set(), planner.FEW_PAIRS
    try:
        for few in (0, 10**9):
            planner.FEW_PAIRS = few
            with pytest.raises(PlanInputError) as refused:
                plan_pairs([4, 3, 4], [0, 0, 0], [1, 2, 1], index)
            messages.add(str(refused.value))
    finally:
        planner.FEW_PAIRS = saved
    assert messages == {"token 4 routes to layer 0 expert 1 twice"}


@SETTINGS
@given(scenarios())
def test_a_batchs_backups_are_true_before_ranking_exactly_when_ranked_ones_exist(scenario):
    """A plan of few pieces ranks each batch's backups when first read (spread.RankedLater); its truth,
    which the forward reads of every request, comes without ranking and agrees with the ranked list, and
    reading them twice gives the same list."""
    providers, holdings, policy, routings, options, _ = scenario
    index = ShardIndex.build(MODEL, providers, holdings, policy)
    truth = [bool(b.backups) for b in plan_pairs(*_pair_columns(routings), index, **options).batches]
    plan = plan_pairs(*_pair_columns(routings), index, **options)
    ranked = [list(b.backups) for b in plan.batches]
    assert truth == [bool(r) for r in ranked]
    assert ranked == [list(b.backups) for b in plan.batches]
    assert [len(b.backups) for b in plan.batches] == [len(r) for r in ranked]
    assert all(b.backups[:] == tuple(r) and (not r or b.backups[-1] == r[-1])
               for b, r in zip(plan.batches, ranked, strict=True))


def _pair_columns(routings):
    pairs = [(r["token_index"], e["layer"], e["expert"]) for r in routings for e in r["experts"]]
    return [[p[i] for p in pairs] for i in range(3)] if pairs else [[], [], []]
