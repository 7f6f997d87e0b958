"""Dashboard pages."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.dashboard.access import dashboard_page
from apps.governance.selectors import policy_active, policy_to_dict
from apps.node.selectors import node_info, node_processes
from apps.providers.selectors import gossip_status
from apps.receipts.selectors import receipts_count, receipts_list
from apps.repair.selectors import repair_passes
from apps.worker.selectors import worker_status_published

RECEIPTS_SHOWN = 20
REPAIR_PASSES_SHOWN = 10


@dashboard_page
def home(request: HttpRequest) -> HttpResponse:
    context = {"node": node_info(), "processes": node_processes(), "policy": policy_to_dict(policy_active()),
               "receipts": receipts_list(limit=RECEIPTS_SHOWN), "receipts_total": receipts_count(),
               "repair_passes": repair_passes(limit=REPAIR_PASSES_SHOWN),
               "runtime": worker_status_published(), "gossip": gossip_status()}
    return render(request, "dashboard/home.html", context)
