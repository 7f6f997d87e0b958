from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),  # the dashboard's login and logout
    path("", include("apps.api.urls")),
    path("", include("apps.serving.urls")),  # the OpenAI-compatible API under /v1
    path("", include("apps.blobs.urls")),
    path("", include("apps.worker.urls")),  # before providers': its peer/<method> would catch peer/moe/execute
    path("", include("apps.providers.urls")),
    path("", include("apps.dashboard.urls")),
]
