"""Who may call /v1: a live client key, within its requests per minute.

Each web process keeps the keys it has seen (id and limit, by hash), so an admitted request costs one
Redis round trip (its per-minute counter, and the keys' epoch) and no database read. Whatever changes
a key (revoked, its limit edited, deleted: apps.serving.services.keys_changed) bumps the epoch; a
process whose cached epoch differs reads the key again, so a revoked key is refused at its next
request. KEY_CACHE_S bounds a cached key's age should Redis lose the epoch (a restart) or a bump fail.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest
from ninja.security import HttpBearer
from redis.exceptions import RedisError

from apps.api.loop_redis import loop_redis
from apps.serving import selectors, services
from core.errors import RateLimited, Unauthorized, error_for_reason

KEY_CACHE_S = 30.0
_COUNTER_TTL_S = 120  # a minute's counter outlives its minute, then goes


@dataclasses.dataclass(frozen=True)
class AdmittedKey:
    id: int
    requests_per_minute: int  # 0: TENZRO_API_KEY_REQUESTS_PER_MINUTE
    epoch: bytes | None  # services.KEYS_EPOCH when the key was read
    read_at: float  # time.monotonic()


_keys: dict[str, AdmittedKey] = {}  # by the secret's hash: this process's keys, read since the epoch


async def _counted(key: AdmittedKey | None) -> tuple[bytes | None, int]:
    """The keys' epoch, and this minute's request count of `key` after this request (0 without a key);
    one round trip."""
    try:
        async with loop_redis().pipeline(transaction=False) as pipe:
            pipe.get(services.KEYS_EPOCH)
            if key is not None:
                name = f"tenzro:v1:requests:{key.id}:{int(time.time() // 60)}"
                pipe.incr(name).expire(name, _COUNTER_TTL_S)
            answers = await pipe.execute()
    except (RedisError, OSError) as exc:
        raise error_for_reason("redis_unavailable", f"cannot count this key's requests: Redis does not answer "
                                                    f"({type(exc).__name__})") from exc
    return answers[0], answers[1] if key is not None else 0


async def _read_key(digest: str, epoch: bytes | None) -> AdmittedKey:
    row = await sync_to_async(selectors.key_for_hash)(digest)
    if row is None:
        _keys.pop(digest, None)
        raise Unauthorized("this client key is not valid (unknown or revoked)", reason="invalid_api_key")
    _keys[digest] = AdmittedKey(row.id, row.requests_per_minute, epoch, time.monotonic())
    return _keys[digest]


async def admit(secret: str) -> AdmittedKey:
    """The live key with this secret, its request counted; Unauthorized or RateLimited otherwise."""
    digest = services.key_hash(secret)
    cached = _keys.get(digest)
    if cached is not None and time.monotonic() - cached.read_at > KEY_CACHE_S:
        cached = None
    epoch, count = await _counted(cached)
    if cached is None or cached.epoch != epoch:
        key = await _read_key(digest, epoch)  # the epoch was read first: a change after it bumps it again
        if cached is None or cached.id != key.id:
            count = (await _counted(key))[1]
    else:
        key = cached
    limit = key.requests_per_minute or settings.TENZRO_API_KEY_REQUESTS_PER_MINUTE
    if limit and count > limit:
        raise RateLimited(f"this key made more than {limit} requests this minute", reason="rate_limited",
                          retry_after_s=60 - int(time.time()) % 60)
    return key


class ClientKeyAuth(HttpBearer):
    """ninja's auth of /v1: `request.client_key` is the admitted key (None when keys are not required)."""

    is_async = True  # ninja awaits what __call__ returns: authenticate's coroutine, or None (no header)

    def __init__(self, on_admitted: Any) -> None:
        super().__init__()
        self.on_admitted = on_admitted  # called with the key's id: counts the request, off its path

    def __call__(self, request: HttpRequest) -> Any:
        if not settings.TENZRO_API_KEYS_REQUIRED:
            return self._anyone(request)
        return super().__call__(request)

    async def _anyone(self, request: HttpRequest) -> str:
        request.client_key = None  # type: ignore[attr-defined]
        return "anonymous"

    async def authenticate(self, request: HttpRequest, token: str) -> Any:
        key = await admit(token)
        self.on_admitted(key.id)
        request.client_key = key  # type: ignore[attr-defined]
        return key
