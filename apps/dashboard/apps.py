from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "apps.dashboard"
    label = "dashboard"

    def ready(self) -> None:
        from apps.dashboard.services import (
            push_node_processes,
            push_policy_activated,
            push_providers_changed,
            push_receipts_kept,
            push_repair_pass,
            push_runtime_status,
        )
        from apps.governance.signals import policy_activated
        from apps.node.signals import node_processes_read
        from apps.providers.signals import providers_changed
        from apps.receipts.signals import receipts_kept
        from apps.repair.signals import repair_pass_done
        from apps.worker.signals import worker_state_published

        policy_activated.connect(push_policy_activated, dispatch_uid="dashboard-policy-activated")
        receipts_kept.connect(push_receipts_kept, dispatch_uid="dashboard-receipts-kept")
        repair_pass_done.connect(push_repair_pass, dispatch_uid="dashboard-repair-pass")
        node_processes_read.connect(push_node_processes, dispatch_uid="dashboard-node-processes")
        worker_state_published.connect(push_runtime_status, dispatch_uid="dashboard-runtime-status")
        providers_changed.connect(push_providers_changed, dispatch_uid="dashboard-providers-changed")
