"""The settlement and reputation admin pages: listed, readable, never editable."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from apps.reputation.services import reputation_penalize
from apps.settlement.services import settlement_record

pytestmark = pytest.mark.django_db


def test_admin_pages_show_rows_read_only(client) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    settlement = settlement_record(forward_id="fwd-admin", router_id="r" * 64, model_id="m", holders=[
        {"provider_id": "a" * 64, "tokens": 3, "price_per_input_token": "0.5", "commitments": []}])
    reputation_penalize(provider_id="b" * 64, amount=Decimal(2), reason="timeout", ref="penalty:1")
    for url in ("/admin/settlement/settlement/", "/admin/settlement/ledgerentry/", "/admin/reputation/reputation/",
                "/admin/reputation/reputationevent/", f"/admin/settlement/settlement/{settlement.pk}/change/"):
        page = client.get(url)
        assert page.status_code == 200, url
    detail = client.get(f"/admin/settlement/settlement/{settlement.pk}/change/").content.decode()
    assert "fwd-admin" in detail and "1.350000000000" in detail  # the holder's entry, inline
    assert 'name="_save"' not in detail
    assert client.get("/admin/settlement/settlement/add/").status_code == 403
    assert client.get("/admin/reputation/reputation/add/").status_code == 403
