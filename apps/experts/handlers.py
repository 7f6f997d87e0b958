"""The expert worker's `moe/*` methods over the runtime (served on QUIC and the Channels layer).

Compute and payload decoding run in a thread pool, never on the event loop. Runtime errors
travel back as HandlerError with the runtime's machine-readable reason.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from apps.blobs.store import BlobError
from apps.experts.errors import ExpertRuntimeError
from apps.experts.runtime import ExpertRuntime
from apps.experts.wire import rows_from_bytes, rows_to_bytes
from apps.transport.quic import HandlerError

Result = tuple[dict[str, Any], bytes]
MethodHandler = Callable[[dict[str, Any], bytes], Awaitable[Result]]


def _int_param(params: dict[str, Any], name: str) -> int:
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise HandlerError("invalid_input", f"param {name!r} must be an integer, got {value!r}")
    return value


def _str_param(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise HandlerError("invalid_input", f"param {name!r} must be a non-empty string, got {value!r}")
    return value


def _hidden(params: dict[str, Any], body: bytes) -> np.ndarray:
    try:
        return rows_from_bytes(body, d_model=_int_param(params, "d_model"), tokens=params.get("tokens"))
    except ValueError as exc:
        raise HandlerError("shape_mismatch", str(exc)) from exc


class ExpertHandlers:
    """moe/* handlers bound to one runtime and one executor."""

    def __init__(
        self, *, runtime: ExpertRuntime, executor: Executor, resolve_blob: Callable[[str], bytes] | None = None
    ) -> None:
        """`resolve_blob(uri)` returns a blob's verified bytes (local store or a peer); it may block."""
        self.runtime = runtime
        self._executor = executor
        self._resolve_blob = resolve_blob

    def table(self) -> dict[str, MethodHandler]:
        return {
            "moe/expert_load": self.expert_load,
            "moe/expert_unload": self.expert_unload,
            "moe/gate_load": self.gate_load,
            "moe/gate_unload": self.gate_unload,
            "moe/expert_status": self.expert_status,
            "moe/route": self.route,
            "moe/execute": self.execute,
            "moe/forward_local": self.forward_local,
        }

    async def _call(self, func: Callable[..., Any], **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, functools.partial(func, **kwargs))
        except ExpertRuntimeError as exc:
            raise HandlerError(exc.reason, str(exc)) from exc

    @staticmethod
    def _expected(params: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        return {name: params[name] for name in names if params.get(name) is not None}

    async def _payload(self, params: dict[str, Any], body: bytes, what: str) -> bytes:
        """The payload bytes: the request body, a file on this node (`path`), or a blob (`blob_uri`)."""
        if body:
            return body
        loop = asyncio.get_running_loop()
        path, uri = params.get("path"), params.get("blob_uri")
        if isinstance(path, str) and path:
            try:
                return await loop.run_in_executor(self._executor, Path(path).read_bytes)
            except OSError as exc:
                raise HandlerError("invalid_input", f"cannot read {what} payload file {path}: {exc.strerror}") from exc
        if isinstance(uri, str) and uri and self._resolve_blob is not None:
            try:
                return await loop.run_in_executor(self._executor, self._resolve_blob, uri)
            except BlobError as exc:
                raise HandlerError(exc.reason, str(exc)) from exc
        raise HandlerError("invalid_input", f"no {what} payload: send it as the body, or name a path or blob_uri")

    async def expert_load(self, params: dict[str, Any], body: bytes) -> Result:
        expect = self._expected(params, ("model_id", "layer", "expert"))
        payload = await self._payload(params, body, "expert")
        row = await self._call(self.runtime.expert_load, payload=payload, blob_uri=params.get("blob_uri"),
                               expect=expect)
        return row, b""

    async def expert_unload(self, params: dict[str, Any], body: bytes) -> Result:
        await self._call(self.runtime.expert_unload, model_id=_str_param(params, "model_id"),
                         layer=_int_param(params, "layer"), expert=_int_param(params, "expert"))
        return {"unloaded": True}, b""

    async def gate_load(self, params: dict[str, Any], body: bytes) -> Result:
        expect = self._expected(params, ("model_id", "layer"))
        payload = await self._payload(params, body, "gate")
        row = await self._call(self.runtime.gate_load, payload=payload, blob_uri=params.get("blob_uri"),
                               expect=expect)
        return row, b""

    async def gate_unload(self, params: dict[str, Any], body: bytes) -> Result:
        await self._call(self.runtime.gate_unload, model_id=_str_param(params, "model_id"),
                         layer=_int_param(params, "layer"))
        return {"unloaded": True}, b""

    async def expert_status(self, params: dict[str, Any], body: bytes) -> Result:
        return await self._call(self.runtime.status), b""

    async def route(self, params: dict[str, Any], body: bytes) -> Result:
        routing = await self._call(self.runtime.route, model_id=_str_param(params, "model_id"),
                                   layer=_int_param(params, "layer"), hidden=_hidden(params, body))
        return {"experts": routing.experts.tolist(), "weights": routing.weights.tolist()}, b""

    async def execute(self, params: dict[str, Any], body: bytes) -> Result:
        out = await self._call(self.runtime.execute, model_id=_str_param(params, "model_id"),
                               layer=_int_param(params, "layer"), expert=_int_param(params, "expert"),
                               hidden=_hidden(params, body))
        return {"tokens": int(out.shape[0]), "d_model": int(out.shape[1])}, rows_to_bytes(out)

    async def forward_local(self, params: dict[str, Any], body: bytes) -> Result:
        out = await self._call(self.runtime.forward_local, model_id=_str_param(params, "model_id"),
                               layer=_int_param(params, "layer"), hidden=_hidden(params, body))
        return {"tokens": int(out.shape[0]), "d_model": int(out.shape[1])}, rows_to_bytes(out)
