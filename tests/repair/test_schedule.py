"""The repair schedule: the policy's interval read at every tick, a per-node jitter, one pass at a time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.governance.services import policy_approve, policy_propose
from apps.repair import services
from apps.repair.models import RepairPass, RepairSchedule

pytestmark = pytest.mark.django_db


def _interval(seconds: int) -> None:
    policy_approve(policy_id=policy_propose(changes={"repair_interval_s": seconds}, proposed_by="t").pk,
                   approved_by="t")


def test_passes_follow_the_policys_interval_with_jitter_and_a_change_applies_at_the_next_tick() -> None:
    _interval(100)
    t0 = timezone.now()
    assert services.repair_tick(now=t0) is None  # the first tick only schedules: within one interval
    first = RepairSchedule.objects.get(pk=1)
    assert 0.0 <= first.jitter <= 1.0
    due = t0 + timedelta(seconds=100 * first.jitter)
    assert services.repair_next_due() == due
    assert services.repair_tick(now=due - timedelta(seconds=0.5)) is None
    ran = services.repair_tick(now=due + timedelta(seconds=0.5))
    assert ran is not None and ran.trigger == "schedule" and ran.interval_s == 100 and ran.max_admissions == 2
    assert ran.model_ids == [] and ran.rows == [] and not ran.error  # this node holds nothing yet
    schedule = RepairSchedule.objects.get(pk=1)
    assert 0.9 <= schedule.jitter <= 1.1 and schedule.running_since is None
    # An approved interval counts from the next tick on, without a restart.
    _interval(10)
    assert services.repair_next_due() == schedule.anchor_at + timedelta(seconds=10 * schedule.jitter)
    assert services.repair_tick(now=schedule.anchor_at + timedelta(seconds=12)) is not None
    assert RepairPass.objects.count() == 2


def test_a_running_pass_is_not_started_twice() -> None:
    _interval(1)
    now = timezone.now()
    RepairSchedule.objects.create(pk=1, anchor_at=now - timedelta(seconds=60), jitter=1.0, running_since=now)
    assert services.repair_tick(now=now + timedelta(seconds=5)) is None
    assert RepairPass.objects.count() == 0
    # A pass that crashed long ago (its worker died) no longer blocks the schedule.
    assert services.repair_tick(now=now + timedelta(seconds=700)) is not None


def test_jitter_spreads_first_passes_of_a_network() -> None:
    _interval(120)
    draws = []
    for _ in range(40):
        RepairSchedule.objects.all().delete()
        services.repair_tick()
        draws.append(RepairSchedule.objects.get(pk=1).jitter)
    assert max(draws) - min(draws) > 0.5  # not in lockstep
