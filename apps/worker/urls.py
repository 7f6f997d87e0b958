from django.urls import path

from apps.worker.views import peer_frame

urlpatterns = [
    path("peer/moe/execute", peer_frame, {"method": "moe/execute"}, name="peer-moe-execute"),
    path("peer/receipt/verify", peer_frame, {"method": "receipt/verify"}, name="peer-receipt-verify"),
]
