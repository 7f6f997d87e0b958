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

    def __str__(self) -> str:
        return f"{self.provider_id[:16]}… {self.reason} ({self.model_id} {self.layer}/{self.expert})"
