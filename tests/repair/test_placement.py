"""Placement is repair's rendezvous rule: the providers a later repair pass would pick, whatever the order given."""

from __future__ import annotations

import hashlib

from apps.repair.placement import idle_providers
from apps.repair.selection import ExpertView, RepairRules, placement, rendezvous_order, select_repairs

MODEL = "kimi-k3"
BLOB = "tenzro://blob/" + "cd" * 32
RULES = RepairRules(min_replication=2, max_replication=8, hot_threshold_tps=1000.0, headroom=2.0)


def ids(n: int) -> list[str]:
    return [hashlib.sha256(f"place{i}".encode()).hexdigest() for i in range(n)]


def test_placement_is_the_top_of_the_rendezvous_order_whatever_the_order_given() -> None:
    providers = ids(7)
    for expert in range(50):
        chosen = placement(MODEL, 1, expert, providers, 2)
        assert chosen == rendezvous_order(MODEL, 1, expert, providers)[:2]
        assert placement(MODEL, 1, expert, list(reversed(providers)) + providers[:3], 2) == chosen
    assert sorted(placement(MODEL, 0, 0, providers[:2], 5)) == sorted(providers[:2])  # fewer providers than copies


def test_a_repair_pass_after_a_placement_has_nothing_to_do() -> None:
    providers = ids(5)
    views = [ExpertView(0, e, tuple(sorted(placement(MODEL, 0, e, providers, 2))), BLOB) for e in range(64)]
    chosen = select_repairs(MODEL, views, providers, RULES)
    assert (chosen.rows, chosen.unrepairable, chosen.considered) == ([], [], 0)
    # and a placement with one copy short is completed by exactly the provider placement would have named
    short = [ExpertView(0, 0, (placement(MODEL, 0, 0, providers, 2)[0],), BLOB)]
    (row,) = select_repairs(MODEL, short, providers, RULES).rows
    assert row.provider == placement(MODEL, 0, 0, providers, 2)[1]


def test_a_placement_names_the_providers_it_gives_nothing_of_a_model() -> None:
    providers = sorted(ids(9))
    rows = [{"model_id": model, "provider": p} for model, experts in ((MODEL, 2), ("qwen3", 64))
            for e in range(experts) for p in placement(model, 0, e, providers, 1)]
    given = {r["provider"] for r in rows if r["model_id"] == MODEL}
    # two experts, one copy each, over nine providers: at least seven get nothing of kimi-k3, named in the
    # providers' order; 64 experts reach all nine, so qwen3 is not listed
    assert idle_providers(rows, providers) == [{"model_id": MODEL, "providers": [p for p in providers
                                                                                  if p not in given]}]
    assert len(given) <= 2
    assert idle_providers([], providers) == []
