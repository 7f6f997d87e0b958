from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "apps.dashboard"
    label = "dashboard"

    def ready(self) -> None:
        from apps.dashboard.services import push_policy_activated, push_receipts_kept
        from apps.governance.signals import policy_activated
        from apps.receipts.signals import receipts_kept

        policy_activated.connect(push_policy_activated, dispatch_uid="dashboard-policy-activated")
        receipts_kept.connect(push_receipts_kept, dispatch_uid="dashboard-receipts-kept")
