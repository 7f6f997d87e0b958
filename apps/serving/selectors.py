"""Reads of client keys."""

from __future__ import annotations

from typing import Any

from apps.serving.models import ClientKey


def key_for_hash(digest: str) -> ClientKey | None:
    """The live (not revoked) key whose secret hashes to `digest` (services.key_hash), or None."""
    return ClientKey.objects.filter(key_hash=digest, revoked_at__isnull=True).first()


def key_to_dict(row: ClientKey) -> dict[str, Any]:
    return {"name": row.name, "prefix": row.prefix, "requests_per_minute": row.requests_per_minute,
            "created_at": row.created_at, "revoked_at": row.revoked_at, "last_used_at": row.last_used_at,
            "requests": row.requests, "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens}


def keys_list(*, include_revoked: bool = True) -> list[dict[str, Any]]:
    rows = ClientKey.objects.all()
    if not include_revoked:
        rows = rows.filter(revoked_at__isnull=True)
    return [key_to_dict(row) for row in rows]
