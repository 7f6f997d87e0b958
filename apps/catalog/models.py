"""Prepare jobs: slice + quantize a layer's experts out of a checkpoint and publish blobs."""

import uuid

from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class PrepareJob(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    model_id = models.CharField(max_length=200)
    layer = models.PositiveIntegerField()
    experts = models.JSONField(help_text="Expert ids, ascending (for a dense job: slice ids).")
    dense_slices = models.PositiveIntegerField(
        null=True, blank=True, help_text="A dense layer cut into this many d_ff slices (experts 0..n-1); null: MoE.")
    quant = models.JSONField(null=True, blank=True, help_text="Preset name, per-projection object, or null (f32).")
    checkpoint = models.CharField(max_length=1000, help_text="Checkpoint folder or http(s) URL.")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    error_reason = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # {"gate": {hash, size} | null, "experts": {"<id>": {hash, size, formats}}, and for a dense job
    # "dense": {d_model, d_ff, slice_align, bounds}}: filled as work completes.
    results = models.JSONField(default=dict)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        what = f"{self.dense_slices} dense slices" if self.dense_slices else "experts"
        return f"prepare {self.model_id} layer {self.layer} {what} {self.experts} ({self.state})"


class KnownShape(models.Model):
    """A model's shape as a checkpoint's config.json stated it (a prepare job here read it, or an operator
    asked catalog-shape with a checkpoint): what a shard map counts coverage against for a model that
    is not in the built-in catalog."""

    model_id = models.CharField(max_length=200, unique=True)
    shape = models.JSONField(help_text="shape_to_dict of the ModelShape (apps/catalog/shapes.py).")
    source = models.CharField(max_length=1000, help_text="The checkpoint folder or URL it was read from.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"shape of {self.model_id}"
