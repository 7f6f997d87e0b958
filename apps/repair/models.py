"""Repair passes: what each pass considered, chose, fetched, skipped and why; and its schedule.

Written only by services.py; the admin and the dashboard show them read-only.
"""

from django.db import models


class RepairPass(models.Model):
    started_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    trigger = models.CharField(max_length=16, help_text="schedule (the policy's interval) or operator (run now).")
    interval_s = models.PositiveIntegerField(help_text="The policy's repair interval when the pass ran.")
    max_admissions = models.PositiveIntegerField(help_text="The policy's experts-per-pass limit when it ran.")
    model_ids = models.JSONField(default=list, help_text="Models this node held experts of (the pass covers them).")
    considered = models.PositiveIntegerField(default=0, help_text="Under- or over-replicated experts in the view.")
    rows = models.JSONField(default=list, help_text="Rows naming this node and their outcome: fetched, deferred, "
                                                  "skipped (with why), drop_pending, dropped.")
    fetched = models.PositiveIntegerField(default=0)
    dropped = models.PositiveIntegerField(default=0)
    unrepairable = models.JSONField(default=list, help_text="(model, layer, expert, reason), at most 100 listed.")
    unrepairable_count = models.PositiveIntegerField(default=0)
    capped = models.JSONField(default=list, help_text=(
        "(model, layer, expert, target, reachable): demand asks for more holders than there are providers; "
        "at most 100 listed."))
    capped_count = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ("-started_at", "-id")
        verbose_name_plural = "repair passes"

    def __str__(self) -> str:
        return f"repair pass {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S} ({self.fetched} fetched)"


class RepairSchedule(models.Model):
    """One row (pk 1): when the next scheduled pass is due. The due time is recomputed from the
    active policy at every tick (anchor + interval x jitter), so an approved interval takes
    effect at the next tick, without a restart."""

    anchor_at = models.DateTimeField(null=True, blank=True, help_text="Start of the last pass (or first tick).")
    jitter = models.FloatField(default=1.0, help_text="This node's factor on the interval for the next pass.")
    running_since = models.DateTimeField(null=True, blank=True)


class TrimWatch(models.Model):
    """An extra copy this node is the lowest-ranked holder of, and for how many consecutive passes
    the holders (and their residency) have not changed: it unloads only from the second."""

    model_id = models.CharField(max_length=200)
    layer = models.PositiveIntegerField()
    expert = models.PositiveIntegerField()
    holders_digest = models.CharField(max_length=64)
    passes = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "trim watches"
        constraints = [models.UniqueConstraint(fields=["model_id", "layer", "expert"], name="repair_trim_key")]
