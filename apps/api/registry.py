"""The one method registry behind both edges: JSON-RPC at /rpc and REST under /api/.

Each app declares its methods in its own `api.py` with `@rpc_method`; the function takes
the validated params Schema (or nothing) and calls one service or selector. Its result is
validated against the method's `response` schema on both edges, so the OpenAPI document
describes exactly what JSON-RPC answers too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from ninja import Schema
from pydantic import BaseModel, ValidationError

# Statuses every method of a kind can answer, added to the ones it declares.
_POST_STATUSES = (400, 413)  # unparsable JSON body; body over TENZRO_RPC_MAX_BYTES
_PARAMS_STATUSES = (422,)  # params that fail the schema (or content the schema cannot describe)
_OPERATOR_STATUSES = (401,)  # no or wrong operator token


@dataclass(frozen=True)
class RpcMethod:
    name: str
    func: Callable[..., Any]
    params: type[BaseModel] | None
    response: type[Schema]
    errors: tuple[int, ...]
    operator_only: bool
    rest_path: str
    http_method: str
    tag: str
    summary: str
    description: str
    links: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def invoke(self, params: BaseModel | None) -> Any:
        """Run the method (sync ones in Django's thread-sensitive executor); a JSON-able result."""
        args = () if self.params is None else (params,)
        if asyncio.iscoroutinefunction(self.func):
            result = await self.func(*args)
        else:
            result = await sync_to_async(self.func, thread_sensitive=True)(*args)
        try:
            return self.response.model_validate(result).model_dump(mode="json")
        except ValidationError as exc:  # the method broke its own contract: a bug, not bad params
            raise ResponseContractError(f"{self.name} returned a result its response schema refuses: {exc}") from exc


class ResponseContractError(RuntimeError):
    """A method's result does not match its declared response schema (answered as internal_error)."""


REGISTRY: dict[str, RpcMethod] = {}


def rpc_method(
    name: str,
    *,
    rest: str,
    tag: str,
    response: type[Schema],
    params: type[BaseModel] | None = None,
    errors: Iterable[int] = (),
    operator_only: bool = False,
    http_method: str = "POST",
    links: dict[str, dict[str, Any]] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `func` as JSON-RPC method `name` and REST route `http_method /api<rest>`.

    `response` is the result schema; `errors` the HTTP statuses of the application errors
    the method can answer besides the ones every method of its kind can (400/413 for a POST
    body, 422 for params, 401 for `operator_only` methods, which need the operator token).
    `links` are OpenAPI links of the result to other operations (`{name: {"operationId": …,
    "parameters" | "requestBody": {…: "$response.body#/…"}}}`): a client, or schemathesis's
    stateful phase, learns which field of this result names what.
    """

    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        if name in REGISTRY:
            raise ValueError(f"JSON-RPC method {name} is registered twice")
        doc = (func.__doc__ or name).strip()
        statuses = set(errors)
        if http_method.upper() == "POST":
            statuses.update(_POST_STATUSES)
        if params is not None:
            statuses.update(_PARAMS_STATUSES)
        if operator_only:
            statuses.update(_OPERATOR_STATUSES)
        REGISTRY[name] = RpcMethod(
            name=name, func=func, params=params, response=response, errors=tuple(sorted(statuses)),
            operator_only=operator_only, rest_path=rest, http_method=http_method.upper(), tag=tag,
            summary=doc.splitlines()[0], description=doc, links=dict(links or {}),
        )
        return func

    return register
