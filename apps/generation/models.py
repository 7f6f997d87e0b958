"""Generations this router ran: the prompt, the tokens as they arrived, and each step's stats."""

from django.db import models


class GenerationState(models.TextChoices):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Generation(models.Model):
    """One generation over the network (tenzro_moeGenerate, or the OpenAI-compatible /v1 API).

    Written only by apps.generation.services, from the expert worker after each step; only the
    last TENZRO_GENERATIONS_KEPT are kept."""

    generation_id = models.CharField(max_length=32, unique=True)
    model_id = models.CharField(max_length=200)
    prompt_ids = models.JSONField(help_text="The prompt's token ids.")
    max_new_tokens = models.PositiveIntegerField()
    options = models.JSONField(default=dict, help_text="allow_partial, wire, stop_at_eos, sampling (with its seed), "
                                                       "stop.")
    state = models.CharField(max_length=9, choices=GenerationState.choices, default=GenerationState.RUNNING)
    tokens = models.JSONField(default=list, help_text="The new token ids, in order.")
    text = models.TextField(blank=True, default="", help_text="The completion's text (a model with a tokenizer), "
                                                              "up to any stop string.")
    finish_reason = models.CharField(max_length=16, blank=True, default="",
                                     help_text="stop, length, cancelled or error; empty while running.")
    ttft_ms = models.FloatField(null=True, blank=True, help_text="Time to the first new token (the prefill).")
    decode_tokens_per_s = models.FloatField(null=True, blank=True)
    error_reason = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"generation {self.generation_id[:12]} {self.model_id} ({self.state}, {len(self.tokens)} tokens)"


class GenerationStep(models.Model):
    """One step of a generation: phase, token, time and each MoE layer's fan-out (`data`).

    A row per step, so that a step's write does not rewrite the steps before it."""

    generation = models.ForeignKey(Generation, on_delete=models.CASCADE, related_name="step_rows")
    index = models.PositiveIntegerField()
    data = models.JSONField(help_text="{index, phase, tokens_in, token, ms, layers: [...]}")

    class Meta:
        ordering = ("generation", "index")
        constraints = [models.UniqueConstraint(fields=("generation", "index"), name="generation_step_once")]

    def __str__(self) -> str:
        return f"step {self.index} of {self.generation_id}"


class LoadedDense(models.Model):
    """A model whose dense part (and gates) this router loaded, and from where: the expert worker loads
    them again when it starts, so a restarted router generates with no operator step."""

    model_id = models.CharField(max_length=200, unique=True)
    checkpoint = models.CharField(max_length=2000, help_text="Where it was read from (a folder, a URL, hub:…).")
    dense_bytes = models.BigIntegerField(default=0)
    loaded_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("model_id",)
        verbose_name_plural = "loaded dense parts"

    def __str__(self) -> str:
        return f"dense part of {self.model_id} from {self.checkpoint}"
