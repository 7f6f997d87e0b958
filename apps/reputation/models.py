"""Provider reputation as this node sees it: a running score and the events that moved it.

The score falls by a penalty per failed batch (apps.forward.services) and by the fraud
penalty for an upheld dispute, and rises only by settlement (apps.settlement.services): the
holder is credited with the net amount it was paid, so reputation tracks paid,
receipt-verified work rather than liveness (docs/specification.md). Written only by services.py; the
event log is append-only and the score row is its running sum.

Amounts are Decimal. PostgreSQL stores them exactly; SQLite keeps about 15 significant digits
(Django reads its REAL values back through a 15-digit context), enough for scores but not a
ledger of record.
"""

from decimal import Decimal

from django.db import models

SCORE_DIGITS = {"max_digits": 30, "decimal_places": 12}


class Reputation(models.Model):
    provider_id = models.CharField(max_length=64, unique=True, help_text="Hex ed25519 public key.")
    score = models.DecimalField(default=Decimal(0), **SCORE_DIGITS,
                                help_text="credits_total − penalties_total; the planner skips providers "
                                          "below the policy's reputation_floor.")
    credits_total = models.DecimalField(default=Decimal(0), **SCORE_DIGITS)
    penalties_total = models.DecimalField(default=Decimal(0), **SCORE_DIGITS)
    credit_count = models.PositiveIntegerField(default=0)
    penalty_count = models.PositiveIntegerField(default=0, help_text="Penalties and fraud penalties.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-score", "provider_id")

    def __str__(self) -> str:
        return f"{self.provider_id[:16]}… {self.score}"


class EventKind(models.TextChoices):
    CREDIT = "credit", "Credit (settlement)"
    PENALTY = "penalty", "Penalty (failed batch)"
    FRAUD = "fraud", "Fraud (upheld dispute)"


class ReputationEvent(models.Model):
    """One move of a provider's score. ``amount`` is the magnitude (≥ 0); the kind gives the sign."""

    provider_id = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    amount = models.DecimalField(**SCORE_DIGITS)
    reason = models.CharField(max_length=200, blank=True)
    ref = models.CharField(max_length=200, help_text="What caused it: a settlement's forward_id, "
                                                     "penalty:<HolderPenalty id>, a dispute id.")
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ("-at", "-id")
        constraints = [
            # The idempotency key: a retried penalty, credit or fraud proof moves the score once.
            models.UniqueConstraint(fields=["provider_id", "kind", "ref"], name="reputation_event_once"),
        ]

    def __str__(self) -> str:
        return f"{self.provider_id[:16]}… {self.kind} {self.amount} ({self.ref})"
