from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "apps.dashboard"
    label = "dashboard"

    def ready(self) -> None:
        from apps.dashboard.services import push_policy_activated
        from apps.governance.signals import policy_activated

        policy_activated.connect(push_policy_activated, dispatch_uid="dashboard-policy-activated")
