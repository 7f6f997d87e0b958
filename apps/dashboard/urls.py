from django.urls import path

from apps.dashboard import pages_shards, views

urlpatterns = [path("", views.home, name="dashboard-home")]
urlpatterns += [
    path("shardmap/", pages_shards.shardmap, name="dashboard-shardmap"),
    path("shardmap/data.json", pages_shards.shardmap_data, name="dashboard-shardmap-data"),
    path("shardmap/cell.json", pages_shards.shardmap_cell, name="dashboard-shardmap-cell"),
    path("dispatch/", pages_shards.dispatch, name="dashboard-dispatch"),
]
