"""Client keys of the OpenAI-compatible API: who may generate through /v1, how often, and what they used.

A key is shown once, when it is made; only its SHA-256 is stored (a key is 32 random bytes, so a plain
hash is as good as a slow one). `prefix` (its first characters) names it in lists and logs."""

from django.db import models


class ClientKey(models.Model):
    name = models.CharField(max_length=100, help_text="Who or what the key is for.")
    prefix = models.CharField(max_length=16, unique=True, help_text="The key's first characters: how lists name it.")
    key_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 (hex) of the whole key.")
    requests_per_minute = models.PositiveIntegerField(
        default=0, help_text="Requests per minute this key may make; 0: TENZRO_API_KEY_REQUESTS_PER_MINUTE.")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0, help_text="Tokens read, over all its requests.")
    completion_tokens = models.PositiveBigIntegerField(default=0, help_text="Tokens generated for it.")

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"{self.prefix}… {self.name}{' (revoked)' if self.revoked_at else ''}"
