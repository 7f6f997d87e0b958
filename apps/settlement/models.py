"""Settlements: what this node, as router, owes holders for each distributed forward.

One Settlement per forward (``forward_id`` is unique: the idempotency key, so a retried
settle_forward task pays once), bound to the forward's receipts by ``receipts_digest``. Its
LedgerEntry rows are the split (apps.settlement.split): per paid holder, one entry to the
holder, one to the router, one to the "burn" account. Written only by services.py; rows are
never changed afterwards.

Amounts are Decimal. PostgreSQL stores them exactly; SQLite keeps about 15 significant
digits (Django reads its REAL values back through a 15-digit context).
"""

from django.db import models

AMOUNT = {"max_digits": 30, "decimal_places": 12}
BURN_ACCOUNT = "burn"


class Settlement(models.Model):
    forward_id = models.CharField(max_length=200, unique=True, help_text="The idempotency key.")
    router_id = models.CharField(max_length=64, help_text="This node's provider id: it dispatched and pays.")
    model_id = models.CharField(max_length=200)
    receipts_digest = models.CharField(
        max_length=64, help_text="BLAKE3 (hex) of the raw 32-byte commitment hashes, concatenated in order.")
    commitments = models.JSONField(default=list, help_text="The commitment hashes (hex), in order.")
    total = models.DecimalField(**AMOUNT, help_text="Sum of the paid holders' gross (price × tokens).")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"settlement {self.forward_id} ({self.total})"


class EntryKind(models.TextChoices):
    HOLDER = "holder", "Holder (net pay)"
    ROUTER = "router", "Router share"
    BURN = "burn", "Burn (the remainder)"


class LedgerEntry(models.Model):
    settlement = models.ForeignKey(Settlement, on_delete=models.PROTECT, related_name="entries")
    account = models.CharField(max_length=64, db_index=True,
                               help_text='A holder\'s or the router\'s provider id, or "burn".')
    kind = models.CharField(max_length=8, choices=EntryKind.choices)
    amount = models.DecimalField(**AMOUNT)
    tokens = models.PositiveBigIntegerField(help_text="Input tokens of the holder's work this entry splits.")
    price = models.CharField(max_length=40, help_text="The holder's advertised price per input token.")

    class Meta:
        ordering = ("settlement_id", "id")
        verbose_name_plural = "ledger entries"

    def __str__(self) -> str:
        return f"{self.kind} {self.account[:16]} {self.amount}"


class PendingSettlement(models.Model):
    """A settlement queued but not yet recorded: the outbox of settle_forward.

    Written in the transaction that queues the task (the forward's receipts), deleted in the one
    that records the Settlement. The broker's copy alone is not enough: a Celery worker killed
    mid-task leaves its message unacknowledged until the broker's visibility timeout (an hour),
    and a Redis restart forgets it; the worker's start requeues every row still here."""

    forward_id = models.CharField(max_length=200, unique=True)
    payload = models.JSONField(help_text="settle_forward's payload, as queued.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"pending settlement {self.forward_id}"
