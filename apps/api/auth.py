"""Operator-token authentication for methods that change the node.

The token comes from TENZRO_OPERATOR_TOKEN, else it is generated on first start into
`<data dir>/operator.token` (0600), where the local CLI reads it.
"""

from __future__ import annotations

import hmac
import os
from functools import cache

from django.conf import settings

from core.env import OPERATOR_TOKEN_FILE, read_or_create_secret
from core.errors import Unauthorized


@cache
def operator_token() -> str:
    return os.environ.get("TENZRO_OPERATOR_TOKEN") or read_or_create_secret(
        settings.TENZRO_DATA_DIR / OPERATOR_TOKEN_FILE
    )


def bearer_token(authorization_header: str | None) -> str | None:
    if not authorization_header:
        return None
    scheme, _, value = authorization_header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def is_operator(token: str | None) -> bool:
    """Constant-time comparison against the operator token."""
    return token is not None and hmac.compare_digest(token.encode(), operator_token().encode())


def operator_refusal(what: str, *, token_sent: bool) -> Unauthorized:
    """The error for a method of the operator door called without this node's token. A token that
    was sent but is not this node's (most often another node's, read from the wrong data dir) is
    told apart from no token at all: "needs the token" would only confuse the operator who sent one."""
    if not token_sent:
        return Unauthorized(f"{what} changes the node and needs the operator token (Authorization: Bearer …)",
                            token="missing")
    return Unauthorized(
        f"{what} changes the node, and the bearer token sent was not accepted: it is not this node's operator "
        "token (another node's? the CLI reads <data dir>/operator.token: set TENZRO_DATA_DIR to this node's "
        "data dir, or pass --token)", token="not_accepted")
