"""Writes of reputation: penalties (failed batches, fraud) and credits (settlement only).

Each call is one transaction: the event row first (its unique (provider_id, kind, ref) makes a
repeat a no-op, so a retried task cannot move a score twice), then the running row with F()
expressions, which the database applies atomically on SQLite and PostgreSQL alike: two
concurrent moves of one provider both land, neither overwrites the other.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from apps.reputation.models import EventKind, Reputation, ReputationEvent
from core.errors import InvalidInput

QUANTUM = Decimal(1).scaleb(-12)  # the columns' 12 decimal places


def reputation_penalize(*, provider_id: str, amount: Decimal, reason: str, ref: str, fraud: bool = False) -> None:
    """Lower `provider_id`'s score by `amount` (≥ 0). `fraud` marks the quarantine-grade penalty of an
    upheld dispute (kind "fraud") rather than a failed batch. A repeat of (provider, kind, ref) is a no-op."""
    _move(provider_id=provider_id, kind=EventKind.FRAUD if fraud else EventKind.PENALTY, amount=amount,
          reason=reason, ref=ref)


def reputation_credit(*, provider_id: str, amount: Decimal, reason: str, ref: str) -> None:
    """Raise `provider_id`'s score by `amount` (≥ 0): the net amount a settlement paid it.

    Only apps.settlement calls this (tests/reputation checks so): reputation rises by paid,
    receipt-verified work and nothing else. A repeat of (provider, ref) is a no-op.
    """
    _move(provider_id=provider_id, kind=EventKind.CREDIT, amount=amount, reason=reason, ref=ref)


def _checked(amount: Decimal, what: str) -> Decimal:
    try:
        value = Decimal(amount) if isinstance(amount, Decimal | int | str) else Decimal(str(amount))
        if not value.is_finite() or value < 0:
            raise InvalidOperation
        return value.quantize(QUANTUM)
    except (InvalidOperation, ValueError, TypeError):
        raise InvalidInput(f"{what} must be a finite amount ≥ 0, got {amount!r}", reason="invalid_input") from None


@transaction.atomic
def _move(*, provider_id: str, kind: str, amount: Decimal, reason: str, ref: str) -> None:
    if not isinstance(provider_id, str) or not provider_id:
        raise InvalidInput(f"provider_id must be a non-empty string, got {provider_id!r}", reason="invalid_input")
    amount = _checked(amount, "amount")
    try:
        with transaction.atomic():  # a savepoint: the duplicate's IntegrityError must not poison the caller's
            ReputationEvent.objects.create(provider_id=provider_id, kind=kind, amount=amount, reason=reason[:200],
                                           ref=ref[:200])
    except IntegrityError:
        return  # this (provider, kind, ref) already moved the score
    Reputation.objects.get_or_create(provider_id=provider_id)  # handles a concurrent first create itself
    credit = kind == EventKind.CREDIT
    changes = {"score": F("score") + amount if credit else F("score") - amount, "updated_at": timezone.now()}
    if credit:
        changes |= {"credits_total": F("credits_total") + amount, "credit_count": F("credit_count") + 1}
    else:
        changes |= {"penalties_total": F("penalties_total") + amount, "penalty_count": F("penalty_count") + 1}
    Reputation.objects.filter(provider_id=provider_id).update(**changes)
