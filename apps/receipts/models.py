"""Receipts this router kept in full (1 in N verified batches), and the disputes over them.

A Receipt row is everything a re-execution needs and a fraud proof shows: the exact request
carrier the holder received, the committed sketch, and the signed receipt as it arrived.
Written only by services.py; the admin shows them read-only.
"""

from django.db import models


class Receipt(models.Model):
    commitment_hash = models.CharField(max_length=64, unique=True, help_text=(
        "The batch's commitment: BLAKE3 of the signed body (v1), or of \"<that hash>/<batch>\" for batch "
        "`batch` of a multi-expert receipt (v2)."))
    router_id = models.CharField(max_length=64, help_text="This node: the router that verified and kept it.")
    provider_id = models.CharField(max_length=64, db_index=True, help_text="The holder that signed it.")
    model_id = models.CharField(max_length=200)
    layer = models.PositiveIntegerField()
    expert = models.PositiveIntegerField()
    tokens = models.PositiveIntegerField()
    body = models.JSONField(help_text="The signed receipt body (docs/protocol.md, \"Receipts\").")
    signature = models.CharField(max_length=128)
    sketch = models.BinaryField(help_text="Per row: k uint32 LE indices, then k f32 LE values.")
    carrier = models.BinaryField(help_text="The exact request body the holder received.")
    batch = models.PositiveSmallIntegerField(null=True, blank=True, help_text=(
        "This batch's place in a multi-expert receipt's `batches` (null: a single-expert receipt)."))
    blob_uri = models.CharField(max_length=100, null=True, blank=True,
                                help_text="Where the holder's expert weights can be fetched (its holding).")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = [models.Index(fields=["model_id", "layer", "expert"])]

    def __str__(self) -> str:
        return f"receipt {self.commitment_hash[:16]}… {self.model_id} {self.layer}/{self.expert}"


class DisputeState(models.TextChoices):
    PENDING = "pending", "Pending"
    UPHELD = "upheld", "Upheld"
    DISMISSED = "dismissed", "Dismissed"


class Dispute(models.Model):
    receipt = models.OneToOneField(Receipt, on_delete=models.PROTECT, related_name="dispute")
    state = models.CharField(max_length=16, choices=DisputeState.choices, default=DisputeState.PENDING)
    difference = models.FloatField(null=True, blank=True, help_text="Measured, in units of a row's scale.")
    tolerance = models.FloatField(null=True, blank=True)
    detail = models.TextField(blank=True, default="")
    signature_valid = models.BooleanField(null=True, blank=True,
                                          help_text="The receipt's signature checked again at the verdict.")
    penalty = models.FloatField(null=True, blank=True, help_text="Reputation taken from the signer (upheld).")
    error = models.TextField(blank=True, default="", help_text="Why the last re-execution could not run.")
    verifier_id = models.CharField(max_length=64, blank=True, default="", help_text=(
        "The other holder of the expert whose signed verdict this dispute holds (empty: none answered, or "
        "none was asked because this node had its own copy)."))
    verdict = models.JSONField(null=True, blank=True, help_text=(
        "That holder's signed verdict as it came (docs/protocol.md, \"Disputes by another holder\")."))
    reexecuted_here = models.BooleanField(default=False, help_text=(
        "This node re-executed the batch itself (always before a penalty)."))
    attempts = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-opened_at", "-id")

    def __str__(self) -> str:
        return f"dispute of {self.receipt_id} ({self.state})"
