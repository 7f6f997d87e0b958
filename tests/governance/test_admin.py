"""The Django admin path: add a proposal, approve it with the admin action."""

import pytest
from django.contrib.auth.models import User

from apps.governance.models import Policy, PolicyStatus
from apps.governance.selectors import policy_active

pytestmark = pytest.mark.django_db


def test_admin_proposal_and_approval(client) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    form = client.get("/admin/governance/policy/add/")
    assert form.status_code == 200 and b'value="120"' in form.content  # starts from the active values

    values = {**policy_active().values(), "min_replication": 4, "note": "more replicas"}
    response = client.post("/admin/governance/policy/add/", values)
    assert response.status_code == 302
    proposal = Policy.objects.get(status=PolicyStatus.PROPOSED)
    assert proposal.proposed_by == "root" and proposal.min_replication == 4

    response = client.post("/admin/governance/policy/", {"action": "approve_proposals",
                                                         "_selected_action": [proposal.pk]})
    assert response.status_code == 302
    assert policy_active().pk == proposal.pk


def test_admin_refuses_shares_over_the_whole(client) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    values = {**policy_active().values(), "settlement_holder_share": 0.9, "settlement_router_share": 0.2, "note": ""}
    response = client.post("/admin/governance/policy/add/", values)
    assert response.status_code == 200  # the form again, with the error
    assert "must be ≤ 1" in response.content.decode()
    assert not Policy.objects.filter(status=PolicyStatus.PROPOSED).exists()
