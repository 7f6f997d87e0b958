"""REST routes under /api/, generated from the same registry as JSON-RPC.

A method with params takes them as the JSON body (POST) or as query parameters (GET).
Every error answers `{"detail": message, "reason": …}` (ErrorOut) with the status of its
kind (core/errors.py), and each route documents in OpenAPI every status it can answer.
"""

from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Query, Router
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.renderers import BaseRenderer
from ninja.security import HttpBearer

from apps.api.auth import bearer_token, is_operator, operator_refusal
from apps.api.errors import describe_errors
from apps.api.json_body import JsonBodyError, loads
from apps.api.registry import REGISTRY, RpcMethod
from apps.api.schemas import ErrorOut
from core.errors import PayloadTooLarge, TenzroError

_HTTP_REASONS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


class OrjsonRenderer(BaseRenderer):
    """Responses through orjson (a base64 row string ~4x faster than json); results are schema-
    validated first, which refuses the non-finite floats orjson would write as null."""

    media_type = "application/json"

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> bytes:
        return orjson.dumps(data)


class JsonBodyParser(Parser):
    """Bodies through apps/api/json_body.py, as JSON-RPC's: no NaN, no lone surrogates, bounded
    nesting, each refusal with its reason (ninja turns it into HttpError 400, answered below)."""

    def parse_body(self, request: HttpRequest) -> Any:
        return loads(request.body)


class OperatorBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> str | None:
        return token if is_operator(token) else None


def _view_for(method: RpcMethod) -> Any:
    # The annotations below are evaluated when each view is defined (no postponed
    # annotations in this module): ninja reads them to build validation and OpenAPI.
    params_schema = method.params
    if params_schema is None:

        async def view(request: HttpRequest) -> Any:
            return await method.invoke(None)

    elif method.http_method == "GET":

        async def view(request: HttpRequest, params: Query[params_schema]) -> Any:  # type: ignore[valid-type]
            return await method.invoke(params)

    else:

        async def view(request: HttpRequest, params: params_schema) -> Any:  # type: ignore[valid-type]
            return await method.invoke(params)

    view.__name__ = method.name
    return view


def _error(api: NinjaAPI, request: HttpRequest, exc: TenzroError) -> HttpResponse:
    return api.create_response(request, {"detail": exc.message, **exc.data()}, status=exc.http_status)


def build_api() -> NinjaAPI:
    api = NinjaAPI(title="Tenzro MoE node", version="1", urls_namespace="rest", docs_url="/docs",
                   renderer=OrjsonRenderer(), parser=JsonBodyParser())

    @api.exception_handler(TenzroError)
    def tenzro_error(request: HttpRequest, exc: TenzroError) -> HttpResponse:
        return _error(api, request, exc)

    @api.exception_handler(ValidationError)
    def invalid_params(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors]
        return _error(api, request, TenzroError(f"invalid params: {describe_errors(errors)}", reason="invalid_params",
                                                errors=errors))

    @api.exception_handler(AuthenticationError)
    def unauthorized(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        token_sent = bearer_token(request.headers.get("Authorization")) is not None
        return _error(api, request, operator_refusal("this method", token_sent=token_sent))

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        if isinstance(exc.__cause__, JsonBodyError):  # an unparsable body: say why (still 400)
            cause = exc.__cause__
            return api.create_response(request, {"detail": cause.message, **cause.data()}, status=400)
        reason = _HTTP_REASONS.get(exc.status_code, "http_error")
        return api.create_response(request, {"detail": str(exc), "reason": reason}, status=exc.status_code)

    @api.exception_handler(RequestDataTooBig)
    def too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        limit = settings.TENZRO_RPC_MAX_BYTES
        return _error(api, request, PayloadTooLarge(f"request body exceeds TENZRO_RPC_MAX_BYTES ({limit} bytes)",
                                                    limit_bytes=limit, setting="TENZRO_RPC_MAX_BYTES"))

    routers: dict[str, Router] = {}
    for method in sorted(REGISTRY.values(), key=lambda m: m.name):
        router = routers.setdefault(method.tag, Router(tags=[method.tag]))
        router.add_api_operation(
            path=method.rest_path,
            methods=[method.http_method],
            view_func=_view_for(method),
            auth=OperatorBearer() if method.operator_only else None,
            response={200: method.response, **dict.fromkeys(method.errors, ErrorOut)},
            summary=method.summary,
            operation_id=method.name,
            description=f"{method.description}\n\nJSON-RPC: `{method.name}`"
                        + ("; needs the operator token." if method.operator_only else "."),
            openapi_extra={"responses": {200: {"links": method.links}}} if method.links else None,
        )
    for router in routers.values():
        api.add_router("", router)
    return api
