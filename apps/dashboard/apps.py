from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "apps.dashboard"
    label = "dashboard"

    def ready(self) -> None:
        from apps.catalog.signals import prepare_progressed
        from apps.dashboard.services import (
            push_dispute_decided,
            push_forward_done,
            push_generation_batching,
            push_generation_progress,
            push_holdings_changed,
            push_node_processes,
            push_policy_activated,
            push_prepare_progress,
            push_providers_changed,
            push_receipts_kept,
            push_repair_pass,
            push_runtime_status,
        )
        from apps.forward.signals import forward_recorded
        from apps.generation.signals import generation_batching, generation_progressed
        from apps.governance.signals import policy_activated
        from apps.node.signals import node_processes_read
        from apps.providers.signals import holdings_changed, providers_changed
        from apps.receipts.signals import dispute_decided, receipts_kept
        from apps.repair.signals import repair_pass_done
        from apps.worker.signals import worker_state_published

        policy_activated.connect(push_policy_activated, dispatch_uid="dashboard-policy-activated")
        receipts_kept.connect(push_receipts_kept, dispatch_uid="dashboard-receipts-kept")
        repair_pass_done.connect(push_repair_pass, dispatch_uid="dashboard-repair-pass")
        holdings_changed.connect(push_holdings_changed, dispatch_uid="dashboard-holdings-changed")
        dispute_decided.connect(push_dispute_decided, dispatch_uid="dashboard-dispute-decided")
        prepare_progressed.connect(push_prepare_progress, dispatch_uid="dashboard-prepare-progress")
        forward_recorded.connect(push_forward_done, dispatch_uid="dashboard-forward-done")
        node_processes_read.connect(push_node_processes, dispatch_uid="dashboard-node-processes")
        worker_state_published.connect(push_runtime_status, dispatch_uid="dashboard-runtime-status")
        providers_changed.connect(push_providers_changed, dispatch_uid="dashboard-providers-changed")
        generation_progressed.connect(push_generation_progress, dispatch_uid="dashboard-generation-progress")
        generation_batching.connect(push_generation_batching, dispatch_uid="dashboard-generation-batching")
