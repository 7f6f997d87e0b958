"""The expert worker's state as published to the control plane (the node's database).

The worker writes these rows on every change of what it holds (load, unload, eviction,
promotion) and refreshes WorkerState every heartbeat; the web process, the dashboard and
Celery tasks read them instead of asking the worker (apps/worker/selectors.py). Why the
database and not Redis: docs/operations.md, "Worker state in the control plane".
"""

from django.db import models


class Residency(models.TextChoices):
    WARM = "Warm", "Warm (memory tier)"
    COLD = "Cold", "Cold (disk tier)"


class WorkerState(models.Model):
    """One row (pk 1): the worker's node-wide figures and when it last spoke."""

    provider_id = models.CharField(max_length=64)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    published_at = models.DateTimeField(help_text="Last time the holdings were written.")
    heartbeat_at = models.DateTimeField(help_text="Last time the worker said it is alive.")
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="Set by a clean shutdown.")
    memory_budget_bytes = models.BigIntegerField()
    memory_used_bytes = models.BigIntegerField()
    committed_tps = models.PositiveIntegerField(
        help_text="Demand: rows served per wall second over the last minute, all experts together.")
    capacity_tps = models.PositiveIntegerField(
        default=0, help_text="Capacity: rows per second of expert compute over the last minute.")
    demand = models.JSONField(default=list, blank=True, help_text=(
        "Per expert demand over the last minute: [model_id, layer, expert, rows/s] for each that served rows."))
    backend = models.CharField(max_length=32)
    cpu_kernel = models.CharField(max_length=64)
    gpu_backend_active = models.BooleanField(default=False)
    compute = models.JSONField(default=dict, blank=True, help_text=(
        "How the compute backend was chosen (a reason per candidate) and the GPU device tier's figures."))

    class Meta:
        verbose_name = verbose_name_plural = "worker state"

    def __str__(self) -> str:
        return f"expert worker pid {self.pid}"


class HeldExpert(models.Model):
    model_id = models.CharField(max_length=200)
    layer = models.PositiveIntegerField()
    expert = models.PositiveIntegerField()
    residency = models.CharField(max_length=4, choices=Residency.choices)
    memory_bytes = models.BigIntegerField()
    disk_bytes = models.BigIntegerField()
    d_model = models.PositiveIntegerField()
    d_ff = models.PositiveIntegerField()
    formats = models.JSONField()
    blob_uri = models.CharField(max_length=100, null=True, blank=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("model_id", "layer", "expert")
        constraints = [models.UniqueConstraint(fields=["model_id", "layer", "expert"], name="worker_held_expert_key")]

    def __str__(self) -> str:
        return f"{self.model_id} L{self.layer} E{self.expert} ({self.residency})"


class HeldGate(models.Model):
    model_id = models.CharField(max_length=200)
    layer = models.PositiveIntegerField()
    router = models.CharField(max_length=16)
    n_routed = models.PositiveIntegerField()
    n_shared_experts = models.PositiveIntegerField()
    top_k = models.PositiveIntegerField()
    d_model = models.PositiveIntegerField()
    memory_bytes = models.BigIntegerField()
    blob_uri = models.CharField(max_length=100, null=True, blank=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("model_id", "layer")
        constraints = [models.UniqueConstraint(fields=["model_id", "layer"], name="worker_held_gate_key")]

    def __str__(self) -> str:
        return f"{self.model_id} L{self.layer} gate"
