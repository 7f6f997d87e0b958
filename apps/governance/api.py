"""JSON-RPC/REST methods of the governance policy."""

from typing import Any

from ninja import Field, Schema

from apps.api.registry import rpc_method
from apps.governance import selectors, services


class PolicyChanges(Schema):
    min_replication: int | None = Field(None, ge=1)
    max_replication: int | None = Field(None, ge=1)
    hot_threshold_tps: float | None = Field(None, ge=0)
    repair_interval_s: int | None = Field(None, ge=1)
    repair_max_experts_per_pass: int | None = Field(None, ge=1)
    receipt_sample_one_in: int | None = Field(None, ge=1)
    holder_failure_penalty: float | None = Field(None, ge=0)
    fraud_penalty: float | None = Field(None, ge=0)
    settlement_holder_share: float | None = Field(None, ge=0, le=1)


class PolicyProposeParams(Schema):
    changes: PolicyChanges
    note: str = ""


class PolicyDecisionParams(Schema):
    policy_id: int


class PolicyHistoryParams(Schema):
    limit: int = Field(50, ge=1, le=500)


@rpc_method("tenzro_policyGet", rest="/governance/policy", http_method="GET", tag="governance")
def policy_get() -> dict[str, Any]:
    """The active governance policy."""
    return selectors.policy_to_dict(selectors.policy_active())


@rpc_method("tenzro_policyHistory", rest="/governance/policies", http_method="GET", tag="governance",
            params=PolicyHistoryParams)
def policy_history(params: PolicyHistoryParams) -> dict[str, Any]:
    """Every policy, newest first: proposals, the active one, superseded and rejected ones."""
    return {"policies": [selectors.policy_to_dict(p) for p in selectors.policy_history(limit=params.limit)]}


@rpc_method("tenzro_policyPropose", rest="/governance/proposals", tag="governance",
            params=PolicyProposeParams, operator_only=True)
def policy_propose(params: PolicyProposeParams) -> dict[str, Any]:
    """Propose a policy: the active values with the given changes."""
    changes = params.changes.model_dump(exclude_none=True)
    policy = services.policy_propose(changes=changes, proposed_by="operator", note=params.note)
    return selectors.policy_to_dict(policy)


@rpc_method("tenzro_policyApprove", rest="/governance/proposals/approve", tag="governance",
            params=PolicyDecisionParams, operator_only=True)
def policy_approve(params: PolicyDecisionParams) -> dict[str, Any]:
    """Approve a proposal: it becomes the active policy."""
    return selectors.policy_to_dict(services.policy_approve(policy_id=params.policy_id, approved_by="operator"))


@rpc_method("tenzro_policyReject", rest="/governance/proposals/reject", tag="governance",
            params=PolicyDecisionParams, operator_only=True)
def policy_reject(params: PolicyDecisionParams) -> dict[str, Any]:
    """Reject a proposal."""
    return selectors.policy_to_dict(services.policy_reject(policy_id=params.policy_id, rejected_by="operator"))
