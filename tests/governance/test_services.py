"""Governance policy: proposals, approval with history, exactly one active policy."""

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, transaction

from apps.dashboard.services import DASHBOARD_GROUP
from apps.governance.models import Policy, PolicyStatus
from apps.governance.selectors import policy_active
from apps.governance.services import policy_approve, policy_propose, policy_reject
from core.errors import Conflict, InvalidInput

pytestmark = pytest.mark.django_db


def test_genesis_policy_has_seed_defaults() -> None:
    policy = policy_active()
    assert (policy.min_replication, policy.max_replication, policy.hot_threshold_tps) == (2, 8, 1000.0)
    assert (policy.repair_interval_s, policy.repair_max_experts_per_pass, policy.receipt_sample_one_in) == (120, 2, 64)


def test_propose_then_approve_supersedes_and_keeps_history(django_capture_on_commit_callbacks) -> None:
    genesis = policy_active()
    proposal = policy_propose(changes={"min_replication": 3}, proposed_by="alice")
    assert proposal.status == PolicyStatus.PROPOSED and proposal.max_replication == 8
    assert policy_active().pk == genesis.pk  # a proposal changes nothing yet

    with django_capture_on_commit_callbacks() as callbacks:
        policy_approve(policy_id=proposal.pk, approved_by="bob")
    assert len(callbacks) == 1
    active = policy_active()
    assert active.pk == proposal.pk and active.min_replication == 3 and active.decided_by == "bob"
    genesis.refresh_from_db()
    assert genesis.status == PolicyStatus.SUPERSEDED
    assert Policy.objects.filter(status=PolicyStatus.ACTIVE).count() == 1


def test_approval_pushes_to_dashboards_after_commit(django_capture_on_commit_callbacks) -> None:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(DASHBOARD_GROUP, channel)
    try:
        proposal = policy_propose(changes={"hot_threshold_tps": 500.0}, proposed_by="alice")
        with django_capture_on_commit_callbacks(execute=True):
            policy_approve(policy_id=proposal.pk, approved_by="bob")
        message = async_to_sync(layer.receive)(channel)
    finally:
        async_to_sync(layer.group_discard)(DASHBOARD_GROUP, channel)
    assert message["event"] == "policy.changed"
    assert message["payload"]["policy"]["hot_threshold_tps"] == 500.0


def test_invalid_proposals_are_refused() -> None:
    with pytest.raises(InvalidInput, match="max_replication"):
        policy_propose(changes={"min_replication": 9}, proposed_by="x")
    with pytest.raises(InvalidInput, match="unknown policy fields"):
        policy_propose(changes={"quorum": 3}, proposed_by="x")
    assert Policy.objects.count() == 1


def test_only_proposals_can_be_decided() -> None:
    proposal = policy_propose(changes={"min_replication": 3}, proposed_by="alice")
    policy_reject(policy_id=proposal.pk, rejected_by="bob")
    with pytest.raises(Conflict):
        policy_approve(policy_id=proposal.pk, approved_by="bob")
    with pytest.raises(Conflict):
        policy_approve(policy_id=policy_active().pk, approved_by="bob")


def test_database_refuses_a_second_active_policy() -> None:
    values = policy_active().values()
    with pytest.raises(IntegrityError), transaction.atomic():
        Policy.objects.create(status=PolicyStatus.ACTIVE, **values)


def test_genesis_policy_has_settlement_and_reputation_defaults() -> None:
    policy = policy_active()
    assert (policy.holder_failure_penalty, policy.fraud_penalty) == (1.0, 100.0)
    assert (policy.settlement_holder_share, policy.settlement_router_share) == (0.9, 0.05)
    assert policy.reputation_floor == -50.0


def test_shares_over_the_whole_are_refused() -> None:
    with pytest.raises(InvalidInput, match="settlement_router_share") as caught:
        policy_propose(changes={"settlement_holder_share": 0.9, "settlement_router_share": 0.2}, proposed_by="a")
    assert caught.value.reason == "invalid_policy"
    with pytest.raises(InvalidInput, match="settlement_router_share"):
        policy_propose(changes={"settlement_router_share": 1.5}, proposed_by="a")
    # Exactly the whole (no burn) is allowed, and so is a negative floor.
    proposal = policy_propose(changes={"settlement_holder_share": 0.75, "settlement_router_share": 0.25,
                                       "reputation_floor": -10.0}, proposed_by="a")
    assert proposal.values()["reputation_floor"] == -10.0
