"""Writes of the governance policy: propose, approve (apply), reject."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.governance.models import POLICY_VALUE_FIELDS, Policy, PolicyStatus
from apps.governance.selectors import policy_active, policy_to_dict
from apps.governance.signals import policy_activated
from core.errors import Conflict, InvalidInput, NotFound


def _check_values(policy: Policy) -> None:
    try:
        policy.full_clean(exclude=["status", "note", "proposed_by", "decided_by", "decided_at"])
    except ValidationError as exc:
        raise InvalidInput(f"invalid policy: {exc.message_dict}", reason="invalid_policy",
                           errors=exc.message_dict) from exc
    problems = {}
    if policy.max_replication < policy.min_replication:
        problems["max_replication"] = f"must be ≥ min_replication ({policy.min_replication})"
    if not 0 <= policy.settlement_holder_share <= 1:
        problems["settlement_holder_share"] = "must be between 0 and 1"
    if not 0 <= policy.settlement_router_share <= 1:
        problems["settlement_router_share"] = "must be between 0 and 1"
    elif policy.settlement_holder_share + policy.settlement_router_share > 1:
        # Model.clean says the same; kept here so a row built around full_clean still cannot pass.
        problems["settlement_router_share"] = "settlement_holder_share + settlement_router_share must be ≤ 1"
    if problems:
        raise InvalidInput(f"invalid policy: {problems}", reason="invalid_policy", errors=problems)


def _lock_proposal(policy_id: int, *, verb: str) -> Policy:
    """The proposal row, locked for this transaction; NotFound / Conflict otherwise."""
    policy = Policy.objects.select_for_update().filter(pk=policy_id).first()
    if policy is None:
        raise NotFound(f"no policy proposal #{policy_id}", reason="policy_not_found")
    if policy.status != PolicyStatus.PROPOSED:
        raise Conflict(f"policy #{policy_id} is {policy.status}, only a proposal can be {verb}",
                       reason="policy_not_proposed")
    return policy


def policy_propose(*, changes: dict[str, Any], proposed_by: str, note: str = "") -> Policy:
    """Create a proposal: the active policy's values with `changes` applied."""
    unknown = sorted(set(changes) - set(POLICY_VALUE_FIELDS))
    if unknown:
        raise InvalidInput(f"unknown policy fields: {', '.join(unknown)}", reason="invalid_policy")
    values = {**policy_active().values(), **changes}
    policy = Policy(status=PolicyStatus.PROPOSED, proposed_by=proposed_by, note=note, **values)
    _check_values(policy)
    policy.save()
    return policy


@transaction.atomic
def policy_approve(*, policy_id: int, approved_by: str) -> Policy:
    """Apply a proposal: it becomes the active policy and the previous one is superseded.

    Row locks (on PostgreSQL) make two concurrent approvals serialize; the partial unique
    constraint is the backstop that keeps exactly one active policy.
    """
    policy = _lock_proposal(policy_id, verb="approved")
    _check_values(policy)
    now = timezone.now()
    Policy.objects.select_for_update().filter(status=PolicyStatus.ACTIVE).update(
        status=PolicyStatus.SUPERSEDED
    )
    policy.status, policy.decided_by, policy.decided_at = PolicyStatus.ACTIVE, approved_by, now
    policy.save(update_fields=["status", "decided_by", "decided_at"])
    snapshot = policy_to_dict(policy)
    transaction.on_commit(lambda: policy_activated.send(sender=Policy, policy=snapshot))
    return policy


@transaction.atomic
def policy_reject(*, policy_id: int, rejected_by: str) -> Policy:
    policy = _lock_proposal(policy_id, verb="rejected")
    policy.status, policy.decided_by, policy.decided_at = PolicyStatus.REJECTED, rejected_by, timezone.now()
    policy.save(update_fields=["status", "decided_by", "decided_at"])
    return policy
