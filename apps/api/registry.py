"""The one method registry behind both edges: JSON-RPC at /rpc and REST under /api/.

Each app declares its methods in its own `api.py` with `@rpc_method`; the function takes
the validated params Schema (or nothing) and calls one service or selector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from ninja import Schema
from pydantic import BaseModel


@dataclass(frozen=True)
class RpcMethod:
    name: str
    func: Callable[..., Any]
    params: type[Schema] | None
    operator_only: bool
    rest_path: str
    http_method: str
    tag: str
    summary: str

    async def invoke(self, params: Schema | None) -> Any:
        """Run the method (sync ones in Django's thread-sensitive executor) and return a JSON-able result."""
        args = () if self.params is None else (params,)
        if asyncio.iscoroutinefunction(self.func):
            result = await self.func(*args)
        else:
            result = await sync_to_async(self.func, thread_sensitive=True)(*args)
        return to_jsonable(result)


REGISTRY: dict[str, RpcMethod] = {}


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def rpc_method(
    name: str,
    *,
    rest: str,
    tag: str,
    params: type[Schema] | None = None,
    operator_only: bool = False,
    http_method: str = "POST",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `func` as JSON-RPC method `name` and REST route `http_method /api<rest>`.

    `operator_only` methods (those that change the node) need the operator token on both edges.
    """

    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        if name in REGISTRY:
            raise ValueError(f"JSON-RPC method {name} is registered twice")
        summary = (func.__doc__ or name).strip().splitlines()[0]
        REGISTRY[name] = RpcMethod(
            name=name, func=func, params=params, operator_only=operator_only, rest_path=rest,
            http_method=http_method.upper(), tag=tag, summary=summary,
        )
        return func

    return register
