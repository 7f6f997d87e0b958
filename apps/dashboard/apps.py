from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "apps.dashboard"
    label = "dashboard"

    def ready(self) -> None:
        from apps.dashboard.services import (
            push_holdings_changed,
            push_policy_activated,
            push_receipts_kept,
            push_repair_pass,
        )
        from apps.governance.signals import policy_activated
        from apps.providers.signals import holdings_changed
        from apps.receipts.signals import receipts_kept
        from apps.repair.signals import repair_pass_done

        policy_activated.connect(push_policy_activated, dispatch_uid="dashboard-policy-activated")
        receipts_kept.connect(push_receipts_kept, dispatch_uid="dashboard-receipts-kept")
        repair_pass_done.connect(push_repair_pass, dispatch_uid="dashboard-repair-pass")
        holdings_changed.connect(push_holdings_changed, dispatch_uid="dashboard-holdings-changed")
