from django.urls import path

from apps.blobs.views import blob_get

urlpatterns = [path("blobs/<str:blob_hash>", blob_get, name="blob-get")]
