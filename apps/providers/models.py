"""The gossip view: every provider record this node holds, its holdings, and gossip counters.

Written only by apps/providers/services.py (gossip merges, this node's own record); read by the
shard map, the planner, the worker's peer pins, the dashboard and the admin (read-only).
"""

from django.db import models


class Provider(models.Model):
    provider_id = models.CharField(max_length=64, unique=True, help_text="Hex ed25519 public key.")
    name = models.CharField(max_length=64, blank=True, default="",
                            help_text="The short name its operator signed into its record; not an identity.")
    is_self = models.BooleanField(default=False)
    seq = models.BigIntegerField()
    issued_at_ms = models.BigIntegerField()
    alive_ms = models.BigIntegerField(help_text="Newest signed liveness: heartbeat, else issue time.")
    record_text = models.TextField(help_text="The signed canonical JSON, exactly as received.")
    signature = models.CharField(max_length=128)
    heartbeat = models.JSONField(null=True, blank=True, help_text="{seq, at_ms, signature}")
    rumor_rounds = models.IntegerField(default=0)
    roles = models.JSONField(default=list)
    http_endpoint = models.CharField(max_length=2048, null=True, blank=True)
    quic_endpoint = models.CharField(max_length=262, null=True, blank=True)
    quic_cert_sha256 = models.CharField(max_length=64, null=True, blank=True)
    moe_gpu = models.BooleanField(default=False)
    activation_codecs = models.JSONField(default=list, help_text="What its moe/execute accepts, preferred first.")
    execute_batches = models.BooleanField(default=False, help_text="Its moe/execute takes a multi-expert frame.")
    price_per_input_token = models.CharField(max_length=40)
    latency_ms = models.FloatField(null=True, blank=True, help_text="Recent round trip measured by this node.")
    wire_ns_per_byte = models.FloatField(
        null=True, blank=True,
        help_text="Recent time per byte its large answers took beyond the round trip and its compute, measured "
                  "by this node (ns), as of wire_measured_ms.")
    wire_measured_ms = models.BigIntegerField(null=True, blank=True,
                                              help_text="When wire_ns_per_byte was last measured (Unix ms).")
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("provider_id",)
        indexes = [models.Index(fields=["rumor_rounds"]), models.Index(fields=["alive_ms"])]

    def __str__(self) -> str:
        return f"{self.name or self.provider_id[:16] + '…'} ({self.provider_id[:6]}) seq {self.seq}"


class Holding(models.Model):
    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="holdings")
    model_id = models.CharField(max_length=200)
    layer = models.PositiveIntegerField()
    expert = models.PositiveIntegerField()
    residency = models.CharField(max_length=4)
    committed_tps = models.PositiveBigIntegerField(help_text="Demand: rows served per wall second, last minute.")
    capacity_tps = models.PositiveBigIntegerField(default=0, help_text="Capacity: rows per second of compute.")
    blob_uri = models.CharField(max_length=100, null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["model_id", "layer", "expert"]), models.Index(fields=["blob_uri"])]
        constraints = [models.UniqueConstraint(fields=["provider", "model_id", "layer", "expert"],
                                               name="providers_holding_key")]

    def __str__(self) -> str:
        return f"{self.model_id} L{self.layer} E{self.expert} @ {self.provider_id}"


class GossipCount(models.Model):
    """How many records/heartbeats met each verdict (accepted, forged, replayed, …), since start."""

    verdict = models.CharField(max_length=32, unique=True)
    count = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.verdict}: {self.count}"


class Reachability(models.Model):
    """What a peer's dial-back last said about this node's own endpoints (one row, pk 1)."""

    http_ok = models.BooleanField(default=False)
    quic_ok = models.BooleanField(default=False)
    checked_by = models.CharField(max_length=64, blank=True, default="")
    checked_at = models.DateTimeField(null=True, blank=True)
    detail = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = verbose_name_plural = "reachability"
