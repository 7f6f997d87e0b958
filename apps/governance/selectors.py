"""Reads of the governance policy."""

from typing import Any

from apps.governance.models import Policy, PolicyStatus
from core.errors import NotFound


def policy_active() -> Policy:
    policy = Policy.objects.filter(status=PolicyStatus.ACTIVE).first()
    if policy is None:
        # The initial migration seeds one; reaching this means the database was tampered with.
        raise NotFound("no active governance policy", reason="no_active_policy")
    return policy


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    return {
        "id": policy.pk,
        "status": policy.status,
        **policy.values(),
        "note": policy.note,
        "proposed_by": policy.proposed_by,
        "decided_by": policy.decided_by,
        "created_at": policy.created_at.isoformat(),
        "decided_at": policy.decided_at.isoformat() if policy.decided_at else None,
    }


def policy_history(*, limit: int = 50) -> list[Policy]:
    return list(Policy.objects.order_by("-id")[:limit])
