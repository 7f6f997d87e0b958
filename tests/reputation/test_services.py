"""Reputation: penalties lower a score, credits raise it, a repeat moves it once, only settlement credits."""

from __future__ import annotations

import re
import threading
from decimal import Decimal
from pathlib import Path

import pytest

from apps.reputation.models import Reputation, ReputationEvent
from apps.reputation.selectors import reputation_rows, reputation_scores
from apps.reputation.services import reputation_credit, reputation_penalize
from core.errors import InvalidInput

pytestmark = pytest.mark.django_db

A, B = "a" * 64, "b" * 64


def test_penalty_lowers_and_credit_raises_by_exactly_the_amount() -> None:
    reputation_penalize(provider_id=A, amount=Decimal("1.5"), reason="timeout", ref="penalty:1")
    assert reputation_scores() == {A: -1.5}
    reputation_credit(provider_id=A, amount=Decimal("0.000162"), reason="settlement", ref="fwd-1")
    row = Reputation.objects.get(provider_id=A)
    assert row.score == Decimal("-1.5") + Decimal("0.000162")
    assert (row.credits_total, row.penalties_total) == (Decimal("0.000162"), Decimal("1.5"))
    assert (row.credit_count, row.penalty_count) == (1, 1)
    reputation_penalize(provider_id=A, amount=Decimal(100), reason="dispute upheld", ref="dispute:7", fraud=True)
    assert [e.kind for e in ReputationEvent.objects.order_by("id")] == ["penalty", "credit", "fraud"]
    assert reputation_scores([A, B]) == {A: pytest.approx(-101.5 + 0.000162)}


def test_a_repeat_of_the_same_ref_moves_the_score_once() -> None:
    for _ in range(3):
        reputation_penalize(provider_id=A, amount=Decimal(1), reason="timeout", ref="penalty:9")
        reputation_credit(provider_id=B, amount=Decimal(2), reason="settlement", ref="fwd-9")
    assert reputation_scores() == {A: -1.0, B: 2.0}
    assert ReputationEvent.objects.count() == 2


@pytest.mark.parametrize("amount", [Decimal(-1), Decimal("NaN"), Decimal("Infinity"), "x", float("inf")])
def test_bad_amounts_are_refused(amount) -> None:
    with pytest.raises(InvalidInput, match="amount"):
        reputation_penalize(provider_id=A, amount=amount, reason="timeout", ref="r")
    assert not ReputationEvent.objects.exists()


def test_scores_are_one_query(django_assert_num_queries) -> None:
    for i, pid in enumerate((A, B)):
        reputation_credit(provider_id=pid, amount=Decimal(i + 1), reason="settlement", ref="f")
    with django_assert_num_queries(1):
        assert reputation_scores([A, B, "c" * 64]) == {A: 1.0, B: 2.0}
    with django_assert_num_queries(1):
        assert [r["provider_id"] for r in reputation_rows(10)] == [B, A]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)  # keeps the genesis policy
def test_concurrent_moves_of_one_provider_all_land() -> None:
    """F() updates: threads moving one score at once never overwrite each other."""
    errors: list[BaseException] = []

    def move(i: int) -> None:
        from django.db import connection
        try:
            reputation_credit(provider_id=A, amount=Decimal(1), reason="settlement", ref=f"fwd-{i}")
        except BaseException as exc:  # reported below: a thread's exception would vanish
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=move, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    row = Reputation.objects.get(provider_id=A)
    assert (row.score, row.credit_count) == (Decimal(8), 8)


def test_only_settlement_raises_reputation() -> None:
    """docs/specification.md, "Settlement and reputation": settlement is the only path that raises a score, so
    nothing else calls reputation_credit."""
    root = Path(__file__).resolve().parents[2] / "apps"
    callers = {path.relative_to(root).parts[0] for path in root.rglob("*.py")
               if re.search(r"\breputation_credit\(", path.read_text())}
    assert callers <= {"reputation", "settlement"}
