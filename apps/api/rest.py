"""REST routes under /api/, generated from the same registry as JSON-RPC.

A method with params takes them as the JSON body (POST) or as query parameters (GET);
errors carry the same `reason` as on JSON-RPC, with the HTTP status of the error class.
"""

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Query, Router
from ninja.security import HttpBearer

from apps.api.auth import is_operator
from apps.api.errors import TenzroError
from apps.api.registry import REGISTRY, RpcMethod


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


def build_api() -> NinjaAPI:
    api = NinjaAPI(title="Tenzro MoE node", version="1", urls_namespace="rest", docs_url="/docs")

    @api.exception_handler(TenzroError)
    def tenzro_error(request: HttpRequest, exc: TenzroError) -> HttpResponse:
        return api.create_response(request, {"detail": exc.message, **exc.data()}, status=exc.http_status)

    routers: dict[str, Router] = {}
    for method in sorted(REGISTRY.values(), key=lambda m: m.name):
        router = routers.setdefault(method.tag, Router(tags=[method.tag]))
        router.add_api_operation(
            path=method.rest_path,
            methods=[method.http_method],
            view_func=_view_for(method),
            auth=OperatorBearer() if method.operator_only else None,
            summary=method.summary,
            operation_id=method.name,
            description=f"JSON-RPC: `{method.name}`",
        )
    for router in routers.values():
        api.add_router("", router)
    return api
