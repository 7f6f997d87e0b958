"""JSON-RPC 2.0 request handling over the method registry (spec: jsonrpc.org/specification).

Batches run their calls concurrently and answer in request order; notifications (no
`id`) are executed and never answered; a batch of only notifications answers nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django.conf import settings
from pydantic import ValidationError

from apps.api.auth import operator_refusal
from apps.api.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    describe_errors,
    error_object,
)
from apps.api.json_body import JsonBodyError, loads
from apps.api.registry import REGISTRY, RpcMethod
from core import metrics
from core.errors import PayloadTooLarge, TenzroError

logger = logging.getLogger(__name__)

_MISSING = object()


def _response(request_id: Any, *, result: Any = _MISSING, error: dict | None = None) -> dict[str, Any]:
    if error is not None:
        return {"jsonrpc": "2.0", "error": error, "id": request_id}
    return {"jsonrpc": "2.0", "result": result, "id": request_id}


def _invalid_request(problem: str) -> dict[str, Any]:
    return error_object(INVALID_REQUEST, f"Invalid Request: {problem}", {"reason": "invalid_request"})


def _validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [{"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]} for err in exc.errors()]


def _invalid_params(name: str, exc: ValidationError) -> dict[str, Any]:
    errors = _validation_errors(exc)
    return error_object(INVALID_PARAMS, f"Invalid params for {name}: {describe_errors(errors)}",
                        {"reason": "invalid_params", "errors": errors})


def _bind_params(method: RpcMethod, raw: Any) -> Any:
    """Validate JSON-RPC params (by name or by position) against the method's schema."""
    if method.params is None:
        if raw in (_MISSING, None, {}, []):
            return None
        raise ValueError(f"{method.name} takes no params")
    if raw is _MISSING or raw is None:
        raw = {}
    if isinstance(raw, list):
        names = list(method.params.model_fields)
        if len(raw) > len(names):
            raise ValueError(f"{method.name} takes at most {len(names)} positional params, got {len(raw)}")
        raw = dict(zip(names, raw, strict=False))
    return method.params.model_validate(raw)


async def _handle_call(call: Any, *, operator: bool, token_sent: bool) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return _response(None, error=_invalid_request("expected an object"))
    request_id = call.get("id", _MISSING)
    is_notification = request_id is _MISSING
    reply_id = None if is_notification else request_id

    problem = None
    if call.get("jsonrpc") != "2.0":
        problem = 'member "jsonrpc" must be exactly "2.0"'
    elif not isinstance(call.get("method"), str):
        problem = 'member "method" must be a string'
    elif "params" in call and not isinstance(call["params"], dict | list):
        problem = 'member "params" must be an object or an array'
    elif not is_notification and (isinstance(request_id, bool) or not isinstance(request_id, str | int | float | None)):
        problem = 'member "id" must be a string, a number or null'
        reply_id = None
    if problem is not None:
        return _response(reply_id, error=_invalid_request(problem))

    response = await _run_method(call["method"], call.get("params", _MISSING), operator=operator,
                                 token_sent=token_sent, reply_id=reply_id)
    error = response.get("error")
    # Unknown method names all count as "other": a client cannot grow the label space.
    metrics.RPC_REQUESTS.labels(call["method"] if call["method"] in REGISTRY else "other",
                                "ok" if error is None else metrics.reason_label(
                                    (error.get("data") or {}).get("reason", "method_not_found"))).inc()
    return None if is_notification else response


async def _run_method(name: str, raw_params: Any, *, operator: bool, token_sent: bool, reply_id: Any) -> dict[str, Any]:
    method = REGISTRY.get(name)
    if method is None:
        return _response(reply_id, error=error_object(METHOD_NOT_FOUND, f"Method not found: {name}",
                                                        {"reason": "method_not_found"}))
    if method.operator_only and not operator:
        exc = operator_refusal(name, token_sent=token_sent)
        return _response(reply_id, error=error_object(exc.code, exc.message, exc.data()))
    try:
        params = _bind_params(method, raw_params)
    except ValidationError as exc:
        return _response(reply_id, error=_invalid_params(name, exc))
    except ValueError as exc:
        return _response(reply_id, error=error_object(INVALID_PARAMS, str(exc), {"reason": "invalid_params"}))
    try:
        return _response(reply_id, result=await method.invoke(params))
    except TenzroError as exc:
        return _response(reply_id, error=error_object(exc.code, exc.message, exc.data()))
    except ValidationError as exc:
        return _response(reply_id, error=_invalid_params(name, exc))
    except Exception:
        logger.exception("JSON-RPC method %s failed", name)
        data = {"reason": "internal_error"}
        return _response(reply_id, error=error_object(INTERNAL_ERROR, f"Internal error in {name}", data))


async def handle_payload(body: bytes, *, operator: bool,
                         token_sent: bool = False) -> dict[str, Any] | list[dict[str, Any]] | None:
    """Answer one HTTP body of JSON-RPC: a response, a list of responses, or None (nothing to send)."""
    try:
        payload = loads(body)
    except JsonBodyError as exc:
        return _response(None, error=error_object(PARSE_ERROR, f"Parse error: {exc.message}", exc.data()))
    if isinstance(payload, list):
        if not payload:
            return _response(None, error=_invalid_request("empty batch"))
        limit = settings.TENZRO_RPC_MAX_BATCH
        if len(payload) > limit:
            # Refused whole, before any call runs: each call costs a task and a thread hop, and
            # 20,000 cheap calls in one body held the web process for seconds.
            exc = PayloadTooLarge(f"batch of {len(payload)} calls exceeds TENZRO_RPC_MAX_BATCH ({limit} calls)",
                                  reason="batch_too_large", limit=limit, setting="TENZRO_RPC_MAX_BATCH")
            return _response(None, error=error_object(exc.code, exc.message, exc.data()))
        answers = await asyncio.gather(*(_handle_call(call, operator=operator, token_sent=token_sent)
                                         for call in payload))
        responses = [answer for answer in answers if answer is not None]
        return responses or None
    return await _handle_call(payload, operator=operator, token_sent=token_sent)
