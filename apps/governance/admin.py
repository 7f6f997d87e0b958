"""Admin for the governance policy: operators add proposals and approve or reject them.

Active, superseded and rejected policies are history and read-only; values change only
through a new proposal, never by editing a row in place.
"""

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from apps.governance import services
from apps.governance.models import POLICY_VALUE_FIELDS, Policy, PolicyStatus
from apps.governance.selectors import policy_active
from core.errors import TenzroError


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "min_replication", "max_replication", "hot_threshold_tps",
                    "repair_interval_s", "receipt_sample_one_in", "settlement_holder_share", "settlement_router_share",
                    "reputation_floor", "proposed_by", "decided_by", "decided_at")
    list_filter = ("status",)
    actions = ("approve_proposals", "reject_proposals")
    fields = (*POLICY_VALUE_FIELDS, "note", "status", "proposed_by", "decided_by", "created_at", "decided_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Policy | None = None) -> tuple[str, ...]:
        bookkeeping = ("status", "proposed_by", "decided_by", "created_at", "decided_at")
        if obj is None:
            return bookkeeping
        return (*POLICY_VALUE_FIELDS, "note", *bookkeeping)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        # A new proposal starts from the values in force.
        return policy_active().values()

    def has_delete_permission(self, request: HttpRequest, obj: Policy | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Policy, form: Any, change: bool) -> None:
        if change:
            return  # rows are immutable once created; readonly fields make this unreachable
        created = services.policy_propose(
            changes=obj.values(), proposed_by=request.user.get_username(), note=obj.note
        )
        obj.pk, obj.status = created.pk, created.status

    def _decide(self, request: HttpRequest, queryset: Any, decide: Any, by_kwarg: str, done: str) -> None:
        for policy in queryset.filter(status=PolicyStatus.PROPOSED).order_by("id"):
            try:
                decide(policy_id=policy.pk, **{by_kwarg: request.user.get_username()})
            except TenzroError as exc:
                self.message_user(request, f"Policy #{policy.pk}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"Policy #{policy.pk} {done}.", messages.SUCCESS)

    @admin.action(description="Approve selected proposals (the last one approved becomes active)")
    def approve_proposals(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, services.policy_approve, "approved_by", "approved")

    @admin.action(description="Reject selected proposals")
    def reject_proposals(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, services.policy_reject, "rejected_by", "rejected")
