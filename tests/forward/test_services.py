"""forward_outcome_record: penalty rows, a reputation penalty per fault (not per stall), latencies."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.forward.models import HolderPenalty
from apps.forward.report import Failure
from apps.forward.services import forward_outcome_record
from apps.governance.services import policy_approve, policy_propose
from apps.reputation.models import ReputationEvent
from apps.reputation.selectors import reputation_scores

pytestmark = pytest.mark.django_db

A, B, ME = "a" * 64, "b" * 64, "f" * 64


def failure(provider: str, reason: str) -> Failure:
    return Failure(provider=provider, reason=reason, message="…", layer=0, expert=3, rows=8)


def test_each_fault_lowers_reputation_by_the_active_penalty_but_a_stall_or_a_clean_stop_does_not() -> None:
    policy_approve(policy_id=policy_propose(changes={"holder_failure_penalty": 2.5}, proposed_by="t").pk,
                   approved_by="t")
    forward_outcome_record(model_id="m", failures=[failure(A, "timeout"), failure(A, "bad_receipt"),
                                                   failure(B, "stalled"), failure(B, "shutting_down")],
                           latencies_ms={}, self_id=ME)
    assert HolderPenalty.objects.count() == 4  # the stalled primary and the stopping holder keep their rows
    assert reputation_scores() == {A: -5.0}
    refs = set(ReputationEvent.objects.values_list("ref", flat=True))
    assert refs == {f"penalty:{pk}" for pk in HolderPenalty.objects.filter(provider_id=A).values_list("id", flat=True)}
    assert set(ReputationEvent.objects.values_list("amount", flat=True)) == {Decimal("2.5")}


def test_no_failures_reads_no_policy(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        forward_outcome_record(model_id="m", failures=[], latencies_ms={ME: 3.0}, self_id=ME)
