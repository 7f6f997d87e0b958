from django.urls import path

from apps.providers.views import peer_method

urlpatterns = [path("peer/<path:method>", peer_method, name="peer-method")]
