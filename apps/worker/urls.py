from django.urls import path

from apps.worker.views import peer_frame

urlpatterns = [path("peer/moe/execute", peer_frame, {"method": "moe/execute"}, name="peer-moe-execute")]
