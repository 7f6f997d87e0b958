"""JSON-RPC/REST methods of the governance policy."""

from typing import Any, Literal

from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import DB_INT_MAX, Int, Out, Params, QueryParams, absent_or
from apps.governance import selectors, services

_COUNT = {"ge": 1, "le": DB_INT_MAX}
_AMOUNT = {"ge": 0, "le": 1e300}  # finite: JSON has no inf, and the database stores doubles


class PolicyChanges(Params):
    """Only the fields given change; the others keep the active policy's values."""

    min_replication: Int = absent_or(**_COUNT)
    max_replication: Int = absent_or(**_COUNT, description="Must stay ≥ min_replication.")
    hot_threshold_tps: float = absent_or(**_AMOUNT)
    repair_headroom: float = absent_or(ge=1, le=1e300, description="≥ 1: capacity kept in reserve by repair.")
    repair_interval_s: Int = absent_or(**_COUNT)
    repair_max_experts_per_pass: Int = absent_or(**_COUNT)
    receipt_sample_one_in: Int = absent_or(**_COUNT)
    holder_failure_penalty: float = absent_or(**_AMOUNT)
    fraud_penalty: float = absent_or(**_AMOUNT)
    settlement_holder_share: float = absent_or(ge=0, le=1)
    settlement_router_share: float = absent_or(
        ge=0, le=1, description="holder + router share must stay ≤ 1; the rest is burned.")
    reputation_floor: float = absent_or(ge=-1e300, le=1e300, description="May be negative.")


class PolicyProposeParams(Params):
    changes: PolicyChanges
    note: str = Field("", max_length=10_000)


class PolicyDecisionParams(Params):
    policy_id: Int = Field(ge=1, le=DB_INT_MAX)


class PolicyHistoryParams(QueryParams):
    limit: int = Field(50, ge=1, le=500)


class PolicyOut(Out):
    id: int
    status: Literal["proposed", "active", "superseded", "rejected"]
    min_replication: int
    max_replication: int
    hot_threshold_tps: float
    repair_headroom: float
    repair_interval_s: int
    repair_max_experts_per_pass: int
    receipt_sample_one_in: int
    holder_failure_penalty: float
    fraud_penalty: float
    settlement_holder_share: float
    settlement_router_share: float
    reputation_floor: float
    note: str
    proposed_by: str
    decided_by: str
    created_at: str
    decided_at: str | None


class PolicyHistoryOut(Out):
    policies: list[PolicyOut]


@rpc_method("tenzro_policyGet", rest="/governance/policy", http_method="GET", tag="governance",
            response=PolicyOut, errors=(404,))
def policy_get() -> dict[str, Any]:
    """The active governance policy."""
    return selectors.policy_to_dict(selectors.policy_active())


@rpc_method("tenzro_policyHistory", rest="/governance/policies", http_method="GET", tag="governance",
            params=PolicyHistoryParams, response=PolicyHistoryOut)
def policy_history(params: PolicyHistoryParams) -> dict[str, Any]:
    """Every policy, newest first: proposals, the active one, superseded and rejected ones."""
    return {"policies": [selectors.policy_to_dict(p) for p in selectors.policy_history(limit=params.limit)]}


@rpc_method("tenzro_policyPropose", rest="/governance/proposals", tag="governance",
            params=PolicyProposeParams, response=PolicyOut, errors=(404,), operator_only=True,
            links={name: {"operationId": op, "requestBody": {"policy_id": "$response.body#/id"}}
                   for name, op in (("approve", "tenzro_policyApprove"), ("reject", "tenzro_policyReject"))})
def policy_propose(params: PolicyProposeParams) -> dict[str, Any]:
    """Propose a policy: the active values with the given changes."""
    changes = params.changes.model_dump(exclude_unset=True)
    policy = services.policy_propose(changes=changes, proposed_by="operator", note=params.note)
    return selectors.policy_to_dict(policy)


@rpc_method("tenzro_policyApprove", rest="/governance/proposals/approve", tag="governance",
            params=PolicyDecisionParams, response=PolicyOut, errors=(404, 409), operator_only=True)
def policy_approve(params: PolicyDecisionParams) -> dict[str, Any]:
    """Approve a proposal: it becomes the active policy."""
    return selectors.policy_to_dict(services.policy_approve(policy_id=params.policy_id, approved_by="operator"))


@rpc_method("tenzro_policyReject", rest="/governance/proposals/reject", tag="governance",
            params=PolicyDecisionParams, response=PolicyOut, errors=(404, 409), operator_only=True)
def policy_reject(params: PolicyDecisionParams) -> dict[str, Any]:
    """Reject a proposal."""
    return selectors.policy_to_dict(services.policy_reject(policy_id=params.policy_id, rejected_by="operator"))
