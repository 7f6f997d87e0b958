"""JSON-RPC client the CLI uses to talk to a node."""

from __future__ import annotations

import itertools
import os
from typing import Any

import httpx

from core.env import OPERATOR_TOKEN_FILE, data_dir

DEFAULT_NODE = "http://127.0.0.1:8000"
_ids = itertools.count(1)


class NodeError(Exception):
    """The node could not be reached or answered an error; str() is one line for the operator.
    ``reason``: the error's data.reason when the node answered one (docs/protocol.md), else None."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


def operator_token(explicit: str | None) -> str | None:
    """--token, else $TENZRO_OPERATOR_TOKEN, else the token file the local node generated."""
    if explicit:
        return explicit
    if os.environ.get("TENZRO_OPERATOR_TOKEN"):
        return os.environ["TENZRO_OPERATOR_TOKEN"]
    token_file = data_dir() / OPERATOR_TOKEN_FILE
    return token_file.read_text().strip() if token_file.exists() else None


class NodeClient:
    def __init__(self, node_url: str, *, token: str | None = None, timeout_s: float = 120.0) -> None:
        self.node_url = node_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Call `method`; options the operator left unset (None) are left out, not sent as null."""
        given = {name: value for name, value in (params or {}).items() if value is not None}
        request = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": given}
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = httpx.post(f"{self.node_url}/rpc", json=request, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise NodeError(f"cannot reach node at {self.node_url}: {exc}") from exc
        try:
            answer = response.json()
        except ValueError as exc:
            raise NodeError(f"node at {self.node_url} answered HTTP {response.status_code} without JSON") from exc
        error = answer.get("error") if isinstance(answer, dict) else None
        if error:
            reason = (error.get("data") or {}).get("reason", "error")
            raise NodeError(f"{method} failed: {reason}: {error.get('message')} (code {error.get('code')})",
                            reason=reason)
        return answer.get("result")

