"""The OpenAI-compatible API under /v1: models, completions and chat completions, streamed or whole.

A thin edge over the expert worker's `moe/generate` (apps/generation): the request is checked here
(apps/serving/schemas.py), the prompt is tokenized or rendered there, and the generation's events
come back in a stream mailbox (apps/worker/streams.py) as each step ends; a streaming client gets
each token's text as server-sent events at once, and a client that leaves cancels its generation.
Requests carry a client key (`Authorization: Bearer sk-tz-…`, apps/serving/models.py) unless
TENZRO_API_KEYS_REQUIRED is off; every error answers in OpenAI's shape (docs/openai.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError

from apps.api.json_body import JsonBodyError
from apps.api.rest import JsonBodyParser
from apps.serving import services
from apps.serving.auth import ClientKeyAuth
from apps.serving.responses import CompletionBuilder, Kind
from apps.serving.schemas import ChatRequest, CompletionRequest
from apps.worker.client import worker_call
from apps.worker.streams import new_stream, stream_events
from core.errors import TenzroError, error_for_reason

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}
# Worker reasons whose OpenAI status differs from the node's own API's (docs/openai.md, "Errors").
_STATUS = {"invalid_input": 400, "invalid_params": 400, "token_out_of_range": 400, "context_length_exceeded": 400,
           "text_unavailable": 400, "template_missing": 400, "template_refused": 400, "unsupported_encoding": 400,
           "dense_not_loaded": 404, "busy": 429, "rate_limited": 429}
_CODES = {"dense_not_loaded": "model_not_found", "busy": "server_busy"}
_PARAMS = {"max_new_tokens": "max_tokens", "prompt_ids": "prompt"}  # the worker's names, as OpenAI's clients know them
logger = logging.getLogger("tenzro.serving")
_background: set[asyncio.Task] = set()  # work nobody waits for (apps.serving.v1._later), kept until it ends


class ErrorBody(Schema):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorOut(Schema):
    """Every refusal of /v1, in OpenAI's shape."""

    error: ErrorBody


_ERRORS = {status: OpenAIErrorOut for status in (400, 401, 404, 413, 429, 503)}
# A generation answers JSON, or server-sent events when the request asked to stream.
_GENERATED = {"responses": {200: {"description": "The completion (JSON), or its chunks as server-sent events "
                                                 "(text/event-stream) when `stream` is true.",
                                  "content": {"application/json": {"schema": {"type": "object"}},
                                              "text/event-stream": {"schema": {"type": "string"}}}}}}


def _error_body(status: int, message: str, code: str | None, param: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def openai_error(status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> JsonResponse:
    response = JsonResponse(_error_body(status, message, code, param), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _openai_view(exc: TenzroError) -> tuple[int, dict[str, Any]]:
    """A node error as OpenAI states it: its status and body."""
    status = _STATUS.get(exc.reason, 503 if exc.http_status >= 500 else exc.http_status)
    param = exc.details.get("param")
    param = _PARAMS.get(param, param) if isinstance(param, str) else None
    return status, _error_body(status, exc.message, _CODES.get(exc.reason, exc.reason), param)


def _from_tenzro(exc: TenzroError) -> JsonResponse:
    status, body = _openai_view(exc)
    response = JsonResponse(body, status=status)
    if status == 429:
        response["Retry-After"] = str(int(exc.details.get("retry_after_s", settings.TENZRO_API_RETRY_AFTER_S)))
    return response


def _later(work: Any) -> None:
    """Run a coroutine nobody waits for (a cancel, a counter), kept referenced until it ends."""
    task = asyncio.get_running_loop().create_task(work)
    _background.add(task)
    task.add_done_callback(_background.discard)


def _count_request(key_id: int) -> None:
    _later(sync_to_async(services.key_used)(key_id=key_id, request=True))  # a counter: off the request's path


def build_v1() -> NinjaAPI:
    api = NinjaAPI(title="Tenzro MoE node: OpenAI-compatible API", version="1", urls_namespace="v1",
                   docs_url="/docs", parser=JsonBodyParser(), auth=ClientKeyAuth(on_admitted=_count_request))

    @api.exception_handler(TenzroError)
    def tenzro_error(request: HttpRequest, exc: TenzroError) -> HttpResponse:
        return _from_tenzro(exc)

    @api.exception_handler(ValidationError)
    def invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        first = exc.errors[0] if exc.errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "body_data", "payload")]
        where = ".".join(loc) or None
        return openai_error(400, f"{where or 'the request'}: {first.get('msg', 'is not valid')}",
                            code="invalid_params", param=where)

    @api.exception_handler(AuthenticationError)
    def unauthorized(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return openai_error(401, "this API needs a client key: Authorization: Bearer sk-tz-… "
                                 "(the operator makes them with `tenzro keys create`)", code="invalid_api_key")

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        cause = exc.__cause__
        message = cause.message if isinstance(cause, JsonBodyError) else str(exc)
        return openai_error(exc.status_code, message, code="invalid_json" if isinstance(cause, JsonBodyError) else None)

    @api.get("/models", operation_id="v1_models", summary="The models this router can generate",
             response={200: dict[str, Any], **_ERRORS})
    async def models(request: HttpRequest) -> dict[str, Any]:
        result, _ = await worker_call("moe/models", {})
        return {"object": "list", "data": [{"id": m["model_id"], "object": "model", "created": m["loaded_at"],
                                            "owned_by": "tenzro"} for m in result["models"]]}

    @api.post("/completions", operation_id="v1_completions", summary="A completion of a text prompt",
              response={200: dict[str, Any], **_ERRORS}, openapi_extra=_GENERATED)
    async def completions(request: HttpRequest, body: CompletionRequest) -> HttpResponse:
        return await _generate(request, body, "text", body.worker_params(), logprobs=body.logprobs is not None)

    @api.post("/chat/completions", operation_id="v1_chat_completions", summary="The assistant's next message",
              response={200: dict[str, Any], **_ERRORS}, openapi_extra=_GENERATED)
    async def chat_completions(request: HttpRequest, body: ChatRequest) -> HttpResponse:
        return await _generate(request, body, "chat", body.worker_params(), logprobs=body.logprobs)

    return api


async def _generate(request: HttpRequest, body: CompletionRequest | ChatRequest, kind: Kind,
                    params: dict[str, Any], *, logprobs: bool) -> HttpResponse:
    channel = new_stream()
    started, _ = await worker_call("moe/generate", {"model_id": body.model, **params, "stream": channel})
    generation_id = started["generation_id"]
    key = getattr(request, "client_key", None)
    builder = CompletionBuilder(kind=kind, generation_id=generation_id, model=body.model, created=int(time.time()),
                                logprobs=logprobs,
                                include_usage=bool(body.stream_options and body.stream_options.include_usage))
    events = _Events(generation_id, channel, key.id if key is not None else None, started["prompt_tokens"])
    if body.stream:
        response = StreamingHttpResponse(_sse(events, builder), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the tokens back
        return response
    tokens: list[dict[str, Any]] = []
    async for event in events:
        if event["type"] == "token":
            tokens.append(event)
        elif event["error"]:
            raise error_for_reason(event["error"]["reason"], event["error"]["message"])
        else:
            return JsonResponse(builder.response(tokens, event))
    raise error_for_reason("worker_unavailable", "the generation's stream ended without its end")


class _Events:
    """A generation's events; when the reader stops before the end (the client left), the generation is
    cancelled; either way the key is charged for what was generated."""

    def __init__(self, generation_id: str, channel: str, key_id: int | None, prompt_tokens: int) -> None:
        self.generation_id, self.channel = generation_id, channel
        self.key_id, self.prompt_tokens = key_id, prompt_tokens
        self.completion_tokens, self.ended = 0, False

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        try:
            async for event in stream_events(self.channel, idle_timeout_s=settings.TENZRO_OPENAI_STEP_TIMEOUT_S):
                if event["type"] == "token":
                    self.completion_tokens += 1
                else:
                    self.ended = True
                yield event
        finally:
            if not self.ended:  # the client left, or the stream broke: stop the work nobody will read
                _later(_cancel(self.generation_id))
            if self.key_id is not None:
                _later(sync_to_async(services.key_used)(key_id=self.key_id, prompt_tokens=self.prompt_tokens,
                                                        completion_tokens=self.completion_tokens))


async def _cancel(generation_id: str) -> None:
    try:
        await worker_call("moe/generation_cancel", {"generation_id": generation_id})
    except TenzroError as exc:  # a worker that is gone took its generation with it; a busy one may run it on
        logger.warning("generation %s: its client left, and the cancel did not reach the expert worker (%s); "
                       "it runs to its end", generation_id, exc.message)


def _data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


async def _sse(events: _Events, builder: CompletionBuilder) -> AsyncIterator[bytes]:
    """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`; an error after the stream
    began is sent as `data: {"error": …}` (the status line is already gone)."""
    if (first := builder.first_chunk()) is not None:
        yield _data(first)
    try:
        async for event in events:
            if event["type"] == "token":
                if (chunk := builder.chunk(event)) is not None:
                    yield _data(chunk)
            elif event["error"]:
                failed = error_for_reason(event["error"]["reason"], event["error"]["message"])
                yield _data(_openai_view(failed)[1])
            else:
                for chunk in builder.last_chunks(event):
                    yield _data(chunk)
    except TenzroError as exc:
        yield _data(_openai_view(exc)[1])
    yield b"data: [DONE]\n\n"
