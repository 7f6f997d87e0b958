"""JSON-RPC/REST of client keys: the operator makes, lists and revokes the keys of the /v1 API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import Int, Out, Params
from apps.serving import selectors, services


class KeyOut(Out):
    name: str
    prefix: str = Field(description="The key's first characters: how lists and tenzro_keysRevoke name it.")
    requests_per_minute: int = Field(description="0: TENZRO_API_KEY_REQUESTS_PER_MINUTE.")
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    requests: int
    prompt_tokens: int
    completion_tokens: int


class KeyCreated(KeyOut):
    key: str = Field(description="The secret (Authorization: Bearer …). Shown this once: only its hash is kept.")


class KeyCreateParams(Params):
    name: str = Field(min_length=1, max_length=100)
    requests_per_minute: Int = Field(0, ge=0, le=1_000_000, description="0: TENZRO_API_KEY_REQUESTS_PER_MINUTE.")


class KeyRevokeParams(Params):
    prefix: str = Field(min_length=6, max_length=200, description="The key's prefix (or the whole key).")


class KeysOut(Out):
    keys: list[KeyOut]


@rpc_method("tenzro_keysCreate", rest="/keys/create", tag="keys", params=KeyCreateParams, response=KeyCreated,
            operator_only=True)
async def keys_create(params: KeyCreateParams) -> dict[str, Any]:
    """A client key for the OpenAI-compatible API under /v1."""
    row, secret = await sync_to_async(services.key_create)(name=params.name,
                                                           requests_per_minute=params.requests_per_minute)
    return {**selectors.key_to_dict(row), "key": secret}


@rpc_method("tenzro_keysList", rest="/keys", http_method="GET", tag="keys", response=KeysOut, operator_only=True)
def keys_list() -> dict[str, Any]:
    """Every client key (never its secret), with what it used."""
    return {"keys": selectors.keys_list()}


@rpc_method("tenzro_keysRevoke", rest="/keys/revoke", tag="keys", params=KeyRevokeParams, response=KeyOut,
            errors=(404,), operator_only=True)
def keys_revoke(params: KeyRevokeParams) -> dict[str, Any]:
    """Revoke a client key: its next request is refused (401)."""
    return selectors.key_to_dict(services.key_revoke(prefix=params.prefix))
