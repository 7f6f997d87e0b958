from django.urls import path

from apps.serving.v1 import build_v1

v1 = build_v1()

urlpatterns = [
    path("v1/", v1.urls),
]
