"""forward_outcome_record: penalty rows, a reputation penalty per fault (not per stall), latencies and wire times."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from apps.forward.models import HolderPenalty
from apps.forward.report import Failure
from apps.forward.services import forward_outcome_record
from apps.governance.services import policy_approve, policy_propose
from apps.providers.models import Provider
from apps.providers.selectors import provider_views
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


def test_a_winners_latency_and_wire_time_fold_into_its_provider_and_reach_the_planners_view() -> None:
    for pid in (A, B):
        Provider.objects.create(provider_id=pid, seq=1, issued_at_ms=1, alive_ms=1, record_text="{}",
                                signature="0" * 128, price_per_input_token="0")
    forward_outcome_record(model_id="m", failures=[], latencies_ms={A: 30.0, B: 40.0}, self_id=ME,
                           wire_ns_per_byte={A: 100.0})
    forward_outcome_record(model_id="m", failures=[], latencies_ms={A: 40.0, B: 40.0}, self_id=ME,
                           wire_ns_per_byte={A: 200.0})
    rows = dict(Provider.objects.values_list("provider_id", "wire_ns_per_byte"))
    assert rows == {A: pytest.approx(130.0, rel=1e-3), B: None}  # EWMA 0.7 / 0.3; B moved too few bytes
    views = {v.provider_id: v for v in provider_views()}
    assert views[A].latency_ms == pytest.approx(33.0) and views[A].wire_ns_per_byte == pytest.approx(130.0, rel=1e-3)
    assert views[B].wire_ns_per_byte is None


def test_an_unmeasured_wire_time_halves_every_half_life_and_a_new_sample_folds_into_what_is_left(settings) -> None:
    """A holder measured narrow gets few rows or none, and so no new measurement: decayed, it is tried again."""
    settings.TENZRO_FORWARD_WIRE_HALF_LIFE_S = 60.0
    Provider.objects.create(provider_id=A, seq=1, issued_at_ms=1, alive_ms=1, record_text="{}",
                            signature="0" * 128, price_per_input_token="0", latency_ms=30.0,
                            wire_ns_per_byte=400.0, wire_measured_ms=time.time_ns() // 1_000_000 - 120_000)
    assert provider_views()[0].wire_ns_per_byte == pytest.approx(100.0, rel=1e-3)  # two half-lives
    forward_outcome_record(model_id="m", failures=[], latencies_ms={A: 30.0}, self_id=ME,
                           wire_ns_per_byte={A: 200.0})
    assert provider_views()[0].wire_ns_per_byte == pytest.approx(130.0, rel=1e-3)  # 0.7 x 100 + 0.3 x 200
