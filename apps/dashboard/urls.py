from django.urls import path

from apps.dashboard import pages_generate, pages_node, pages_shards, pages_work, views

urlpatterns = [
    path("", views.home, name="dashboard-home"),
    path("network/", pages_node.network, name="dashboard-network"),
    path("network/rows/", pages_node.network_rows, name="dashboard-network-rows"),
    path("runtime/", pages_node.runtime, name="dashboard-runtime"),
    path("shardmap/", pages_shards.shardmap, name="dashboard-shardmap"),
    path("shardmap/data.json", pages_shards.shardmap_data, name="dashboard-shardmap-data"),
    path("shardmap/cell.json", pages_shards.shardmap_cell, name="dashboard-shardmap-cell"),
    path("dispatch/", pages_shards.dispatch, name="dashboard-dispatch"),
    path("receipts/", pages_work.receipts, name="dashboard-receipts"),
    path("receipts/<int:receipt_id>/dispute/", pages_work.receipt_dispute, name="dashboard-receipt-dispute"),
    path("prepare/", pages_work.prepare, name="dashboard-prepare"),
    path("prepare/start/", pages_work.prepare_start, name="dashboard-prepare-start"),
    path("prepare/<uuid:job_id>/place/", pages_work.prepare_place, name="dashboard-prepare-place"),
    path("forwards/", pages_work.forwards, name="dashboard-forwards"),
    path("generate/", pages_generate.generate, name="dashboard-generate"),
    path("generate/data.json", pages_generate.generate_data, name="dashboard-generate-data"),
    path("generate/batching.json", pages_generate.generate_batching, name="dashboard-generate-batching"),
    path("generate/start/", pages_generate.generate_start, name="dashboard-generate-start"),
    path("repair/", pages_work.repair, name="dashboard-repair"),
]
