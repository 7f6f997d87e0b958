"""What the distributed forwards of this node saw holders do wrong.

One row per failed attempt: the reputation issue turns them into penalties on a provider's
score; the dashboard and the admin (read-only) show them. Written only by services.py.
"""

from django.db import models


class HolderPenalty(models.Model):
    provider_id = models.CharField(max_length=64, db_index=True)
    reason = models.CharField(max_length=64, help_text="timeout, connection_failed, stalled (raced out), …")
    message = models.TextField(blank=True)
    model_id = models.CharField(max_length=200)
    layer = models.PositiveIntegerField()
    expert = models.PositiveIntegerField()
    rows = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ("-at", "-id")
        verbose_name_plural = "holder penalties"

    def __str__(self) -> str:
        return f"{self.provider_id[:16]}… {self.reason} ({self.model_id} {self.layer}/{self.expert})"


class ForwardRecord(models.Model):
    """One distributed forward this node routed, as its stats said (the dashboard's Forwards page).

    Only the last TENZRO_FORWARD_RECORDS_KEPT are kept; written only by services.forward_stats_record."""

    forward_id = models.CharField(max_length=32, unique=True)
    model_id = models.CharField(max_length=200)
    tokens = models.PositiveIntegerField()
    ok = models.BooleanField(help_text="False: the forward failed closed (pairs missing).")
    elapsed_ms = models.FloatField(null=True, blank=True)
    batches = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    replans = models.PositiveIntegerField(default=0)
    hedges_fired = models.PositiveIntegerField(default=0)
    missing = models.PositiveIntegerField(default=0, help_text="(layer, expert, token) pairs not served.")
    stats = models.JSONField(help_text="The forward's stats (holders with latencies, failures, bytes).")
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"forward {self.forward_id[:12]} {self.model_id} ({'ok' if self.ok else 'failed'})"
