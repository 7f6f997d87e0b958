"""The governance policy: every number the network's rules depend on, with history.

A policy row is a proposal until approved; approving it supersedes the active one, so
there is exactly one active policy at any time (a partial unique constraint enforces it)
and every earlier one stays as history.
"""

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class PolicyStatus(models.TextChoices):
    PROPOSED = "proposed", "Proposed"
    ACTIVE = "active", "Active"
    SUPERSEDED = "superseded", "Superseded"
    REJECTED = "rejected", "Rejected"


# Field names that make up the policy values (everything but bookkeeping).
POLICY_VALUE_FIELDS = (
    "min_replication",
    "max_replication",
    "hot_threshold_tps",
    "repair_headroom",
    "repair_interval_s",
    "repair_max_experts_per_pass",
    "receipt_sample_one_in",
    "holder_failure_penalty",
    "fraud_penalty",
    "settlement_holder_share",
    "settlement_router_share",
    "reputation_floor",
)


class Policy(models.Model):
    status = models.CharField(max_length=16, choices=PolicyStatus.choices, default=PolicyStatus.PROPOSED)
    min_replication = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Distinct providers every active expert should have."
    )
    max_replication = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Cap on the holders repair raises a hot expert to."
    )
    hot_threshold_tps = models.FloatField(
        validators=[MinValueValidator(0)],
        help_text="Network-wide demand (committed_tps summed over holders) at or above which an expert is hot.",
    )
    # Repair raises a hot expert to ceil(demand × headroom / one holder's capacity) copies (docs/protocol.md,
    # "Repair selection"): 2 keeps every holder under half its measured capacity.
    repair_headroom = models.FloatField(
        default=2.0, validators=[MinValueValidator(1)],
        help_text="Capacity held in reserve: a hot expert gets ceil(demand × headroom / capacity) holders.",
    )
    repair_interval_s = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Seconds between repair passes."
    )
    repair_max_experts_per_pass = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Experts one repair pass may admit."
    )
    receipt_sample_one_in = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Persist 1 in N verified receipts in full."
    )
    holder_failure_penalty = models.FloatField(
        validators=[MinValueValidator(0)], help_text="Reputation taken from a holder per failed batch."
    )
    fraud_penalty = models.FloatField(
        validators=[MinValueValidator(0)], help_text="Quarantine-grade reputation penalty for an upheld dispute."
    )
    settlement_holder_share = models.FloatField(
        validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="Fraction (0–1) of a settlement paid to the holder.",
    )
    # The rest of a settlement (1 − holder − router) is burned: holder + router ≤ 1 (clean()).
    settlement_router_share = models.FloatField(
        default=0.05, validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="Fraction (0–1) of a settlement paid to the router that dispatched the work.",
    )
    # May be negative: a new provider starts at 0 and a few failures must not shut it out.
    reputation_floor = models.FloatField(
        default=-50.0,
        help_text="Providers whose reputation is below this are never planned on.",
    )
    note = models.TextField(blank=True, default="")
    proposed_by = models.CharField(max_length=150, blank=True, default="")
    decided_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "policies"
        ordering = ("-id",)
        constraints = [
            models.UniqueConstraint(
                fields=["status"], condition=models.Q(status="active"), name="governance_one_active_policy"
            ),
        ]

    def __str__(self) -> str:
        return f"Policy #{self.pk} ({self.status})"

    def clean(self) -> None:
        """holder + router shares may not exceed the whole: the burn (the remainder) is never negative."""
        super().clean()
        holder, router = self.settlement_holder_share, self.settlement_router_share
        if holder is not None and router is not None and holder + router > 1:
            raise ValidationError({"settlement_router_share": (
                f"settlement_holder_share + settlement_router_share must be ≤ 1 (got {holder} + {router})")})

    def values(self) -> dict:
        return {name: getattr(self, name) for name in POLICY_VALUE_FIELDS}
