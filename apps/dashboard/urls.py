from django.urls import path

from apps.dashboard import pages_node, views

urlpatterns = [path("", views.home, name="dashboard-home")]
urlpatterns += [path("network/", pages_node.network, name="dashboard-network"),
                path("network/rows/", pages_node.network_rows, name="dashboard-network-rows"),
                path("runtime/", pages_node.runtime, name="dashboard-runtime")]
