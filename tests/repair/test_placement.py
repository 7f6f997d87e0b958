"""Placement is repair's rendezvous rule: the providers a later repair pass would pick, whatever the order given."""

from __future__ import annotations

import hashlib

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
