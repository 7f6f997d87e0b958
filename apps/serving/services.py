"""Writes of client keys: make one (its secret returned once), revoke one, count what a request used."""

from __future__ import annotations

import hashlib
import logging
import secrets

import redis
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.node.selectors import redis_client
from apps.serving.models import ClientKey
from core.errors import InvalidInput, NotFound

logger = logging.getLogger("tenzro.serving")
KEY_PREFIX = "sk-tz-"
PREFIX_CHARS = 12  # of the key, shown in lists: "sk-tz-" and 6 random characters
KEYS_EPOCH = "tenzro:v1:keys_epoch"  # bumped whenever a key changes: web processes read their cached keys again


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def key_create(*, name: str, requests_per_minute: int = 0) -> tuple[ClientKey, str]:
    """A new key; the secret is returned here and never again."""
    if not name:
        raise InvalidInput("a key needs a name (who or what it is for)", param="name")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ClientKey.objects.create(name=name[:100], prefix=secret[:PREFIX_CHARS], key_hash=key_hash(secret),
                                   requests_per_minute=requests_per_minute)
    return row, secret


def key_revoke(*, prefix: str) -> ClientKey:
    """Revoke the key whose prefix (or whole secret) is given; it stops working at once."""
    row = ClientKey.objects.filter(prefix=prefix[:PREFIX_CHARS]).first()
    if row is None:
        raise NotFound(f"no client key starts with {prefix[:PREFIX_CHARS]!r}", reason="unknown_key")
    if row.revoked_at is None:
        row.revoked_at = timezone.now()
        row.save(update_fields=["revoked_at"])
        keys_changed()
    return row


def keys_changed() -> None:
    """Tell every web process that a key changed (revoked, its limit edited, deleted), once it is committed:
    each reads its cached keys again at their next request (apps/serving/auth.py)."""
    def bump() -> None:
        try:
            redis_client().incr(KEYS_EPOCH)
        except redis.RedisError as exc:  # the cached keys then live out their KEY_CACHE_S
            logger.warning("could not tell the web processes that a client key changed: %s", exc)

    transaction.on_commit(bump)


def key_used(*, key_id: int, prompt_tokens: int = 0, completion_tokens: int = 0, request: bool = False) -> None:
    """Count a request (when it is admitted) and its tokens (when it ends), in one UPDATE each."""
    ClientKey.objects.filter(id=key_id).update(
        requests=F("requests") + int(request), prompt_tokens=F("prompt_tokens") + prompt_tokens,
        completion_tokens=F("completion_tokens") + completion_tokens, last_used_at=timezone.now())
