from django.urls import path

from apps.api.metrics_view import metrics_endpoint
from apps.api.rest import build_api
from apps.api.views import rpc_endpoint

api = build_api()

urlpatterns = [
    path("rpc", rpc_endpoint, name="rpc"),
    path("api/", api.urls),
    path("metrics", metrics_endpoint, name="metrics"),
]
