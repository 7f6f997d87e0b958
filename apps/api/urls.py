from django.urls import path

from apps.api.rest import build_api
from apps.api.views import rpc_endpoint

api = build_api()

urlpatterns = [
    path("rpc", rpc_endpoint, name="rpc"),
    path("api/", api.urls),
]
